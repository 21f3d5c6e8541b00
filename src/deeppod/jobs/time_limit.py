"""A job's time limit (``deeppod submit --time``): the longest one run may last. At its end the
run is stopped as ``deeppod stop`` stops it (SIGTERM, its grace to checkpoint) and the job ends
``stopped``, resumable. An executor whose cluster has a scheduler of its own (Slurm) is handed
the limit and enforces it there; for the others the controller does, here."""

from __future__ import annotations

from sqlalchemy.orm import Session

from deeppod.contract import JobState
from deeppod.jobs.stopping import request_stop
from deeppod.store.models import Job
from deeppod.units import duration_text

_REACHED = "stopped at its "  # how every reason reached() writes begins


def reached(limit_seconds: float | None) -> str:
    """The job's reason when its time limit ended a run (``None``: its cluster's own limit)."""
    limit = f"time limit of {duration_text(limit_seconds)}" if limit_seconds else "partition's time limit"
    return f"{_REACHED}{limit} ('deeppod resume' starts its next run)"


def ended_by(job: Job) -> bool:
    """Whether the job's last run was ended by a time limit (its own or its cluster's)."""
    return job.state == JobState.STOPPED and (job.reason or "").startswith(_REACHED)


def over(job: Job, now: float) -> bool:
    """Whether a running job's current run has lasted its time limit (``now``: the controller's clock)."""
    return (job.time_limit_seconds is not None and job.started_at is not None and job.state == JobState.RUNNING
            and not job.stopping and now - job.started_at.timestamp() >= job.time_limit_seconds)


def stop(s: Session, job: Job) -> None:
    """Ask its workers to stop gracefully: the controller sends SIGTERM in this round."""
    request_stop(s, job, reached(job.time_limit_seconds),
                 told=f"its time limit of {duration_text(job.time_limit_seconds)} is reached")
