"""A job's runs: what a finished run means, the time and GPU-time of the current one, and
putting a job back in the queue for its next run, and whether a waiting reason changed."""

from __future__ import annotations

import logging
import signal
from datetime import UTC

from sqlalchemy.orm import Session

from deeppod.auth.service import revoke_job_tokens
from deeppod.contract import EXIT_RESUME, JobState, describe_exit
from deeppod.executor.base import ExecStatus
from deeppod.jobs import time_limit
from deeppod.jobs.service import add_event, move
from deeppod.store.models import Job, utcnow

log = logging.getLogger(__name__)


def outcome(job: Job, status: ExecStatus, kept: str = "") -> tuple[JobState, str]:
    """What a finished run means: succeeded, failed, cancelled, or requeue (preempted/resized).
    ``kept`` says what its checkpoint folder holds (progress.stop_outcome) for the stop cases."""
    if job.cancel_requested:
        return JobState.CANCELLED, "cancelled by request"
    if job.stop_as == JobState.PRUNED:  # a search ended it for good: what a resume would find says nothing
        kept = ""
    tail = (f"; {kept}" if kept else "") + _killed_in_grace(job, status)
    if job.stop_reason:
        return JobState(job.stop_as or JobState.STOPPED), job.stop_reason + tail
    if status.timed_out:  # its cluster's scheduler ended the run at the job's (or its partition's) limit
        return JobState.STOPPED, time_limit.reached(job.time_limit_seconds) + tail
    if job.state in (JobState.PREEMPTED, JobState.RESIZING):
        return JobState.QUEUED, "requeued: " + (job.reason or str(job.state)) + tail
    codes = status.exit_codes
    if codes and all(c in (0, EXIT_RESUME) for c in codes.values()) and EXIT_RESUME in codes.values():
        return JobState.QUEUED, f"the job exited with {EXIT_RESUME} (resume me){tail}"
    if status.lost_nodes:
        return JobState.QUEUED, f"requeued: {status.reason}; it resumes from its last checkpoint"
    if status.lost:
        return JobState.FAILED, status.reason
    placed = {w["rank"] for w in job.placed_workers}  # workers that left in a shrink exited 0 too
    if codes and placed <= set(codes) and all(c == 0 for c in codes.values()):
        return JobState.SUCCEEDED, "all workers exited with code 0"
    if status.reason:
        return JobState.FAILED, status.reason
    bad = sorted((r, c) for r, c in codes.items() if c != 0)
    if bad:
        return JobState.FAILED, f"rank {bad[0][0]} {describe_exit(bad[0][1])}"
    return JobState.FAILED, "the job ended without every worker reporting an exit code"


def _killed_in_grace(job: Job, status: ExecStatus) -> str:
    """A stopped worker still running at its grace's end is killed: its exit then says nothing
    of "resume me", and the user should know the grace, not the job, ended it."""
    killed = sorted(r for r, c in status.exit_codes.items() if c == -signal.SIGKILL)
    if not killed or not (job.stop_reason or job.state in (JobState.PREEMPTED, JobState.RESIZING)):
        return ""
    return (f"; rank {killed[0]} was killed (SIGKILL) before it exited: a stop gives a job {job.grace_seconds:g} s "
            "after SIGTERM (its grace: --grace of deeppod submit and deeppod train, or grace_seconds in the API)")


NOT_LAUNCHED = ExecStatus(finished=True, reason="never launched")  # what a run decided on and never launched ends as


def never_launched(s: Session, job: Job) -> None:
    """Its server stopped after deciding to start it and before launching it: back to the queue,
    not failed ("the supervisor died"): nothing of it ran."""
    requeue(s, job, "requeued: the server stopped after it decided to start this job and before it launched it; "
                    "nothing of it ran", ran=False)


def run_mark(job: Job) -> str:
    """The run's mark (when it was decided on, UTC): how a restarted server finds its launch."""
    return job.started_at.astimezone(UTC).isoformat() if job.started_at is not None else ""


def current_run_seconds(job: Job) -> float:
    """Wall seconds since the current run (or size) started."""
    if job.started_at is None:
        return 0.0
    return max(0.0, (utcnow() - job.started_at).total_seconds())


def current_run_service(job: Job) -> float:
    """GPU-seconds of the job's current run: its GPUs times the time since it started."""
    if not job.allocation:
        return 0.0
    return current_run_seconds(job) * sum(len(w["gpus"]) for w in job.placed_workers)


def close_run(job: Job) -> None:
    """Add the current run (or size) to the job's attained service and run time."""
    job.attained_gpu_seconds += current_run_service(job)
    job.ran_seconds += current_run_seconds(job)


def requeue(s: Session, job: Job, reason: str, status: ExecStatus | None = None, *, ran: bool = True) -> None:
    """Back to the queue, same id. ``ran``: it ran (a restart, counted), else it never started.
    Its tokens are revoked: the next run is given a new one."""
    if not move(s, job, JobState.QUEUED):
        return
    revoke_job_tokens(s, job.id)
    job.queued_at = utcnow()
    if ran:
        close_run(job)
        job.restart_count += 1
        job.exit_codes = {str(k): v for k, v in sorted(status.exit_codes.items())}
    job.allocation = None
    job.handle = None
    job.endpoint = None  # a restarted replica announces its new address
    job.reason = reason
    add_event(s, job, "requeued", reason)
    log.info("job %s requeued: %s", job.id, reason)
