"""A job's time limit (``deeppod submit --time``): the longest one run may last. At its end the
run is stopped as ``deeppod stop`` stops it (SIGTERM, its grace to checkpoint) and the job ends
``stopped``, resumable. An executor whose cluster has a scheduler of its own (Slurm) is handed
the limit and enforces it there; for the others the controller does, here."""

from __future__ import annotations

from sqlalchemy.orm import Session

from deeppod.contract import JobState
from deeppod.jobs.service import add_event
from deeppod.store.models import Job, utcnow
from deeppod.units import duration_text


def reached(limit_seconds: float | None) -> str:
    """The job's reason when its time limit ended a run (``None``: its cluster's own limit)."""
    limit = f"its time limit of {duration_text(limit_seconds)}" if limit_seconds else "its partition's time limit"
    return f"stopped at {limit} ('deeppod resume' starts its next run)"


def over(job: Job, now: float) -> bool:
    """Whether a running job's current run has lasted its time limit (``now``: the controller's clock)."""
    return (job.time_limit_seconds is not None and job.started_at is not None and job.state == JobState.RUNNING
            and not job.stopping and now - job.started_at.timestamp() >= job.time_limit_seconds)


def stop(s: Session, job: Job) -> None:
    """Ask its workers to stop gracefully: the controller sends SIGTERM in this round."""
    job.stop_reason, job.stop_as, job.stop_requested_at = reached(job.time_limit_seconds), None, utcnow()
    add_event(s, job, "stop-requested", f"its time limit of {duration_text(job.time_limit_seconds)} is reached; "
                                        f"workers get SIGTERM, {job.grace_seconds:g} s to checkpoint, then SIGKILL")
