"""``deeppod shell`` and ``deeppod exec``: which process of a running job a command joins
(executor/enter.py runs it there), and who may: the job's owner or an administrator, with a
token that may change things; anyone else is told the job does not exist."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import Session

from deeppod.auth.roles import check_runs_code
from deeppod.auth.service import Principal
from deeppod.contract import JobState
from deeppod.errors import Conflict, Forbidden, NotFound
from deeppod.executor.enter import worker_process
from deeppod.job_folder import JobFolder
from deeppod.jobs.service import get_job


def target(session: Session, principal: Principal, job_id: int, rank: int, jobs_dir: Path) -> int:
    """The host pid of rank ``rank``'s own command, to run a command beside it."""
    if principal.job_id is not None:
        raise Forbidden("a job's token cannot open a shell: use your own token")
    check_runs_code(principal, "a shell")
    try:
        job = get_job(session, principal, job_id)
    except NotFound:
        job = None
    if job is None or not (principal.is_admin or job.user_id == principal.user_id):
        raise NotFound(f"job {job_id} not found: a shell opens in your own jobs ('deeppod jobs')")
    if job.state != JobState.RUNNING:
        raise Conflict(f"job {job_id} is {job.state}: a shell opens in a running job")
    folder = JobFolder.of(jobs_dir, job_id)
    pids = folder.read_pids() or {}
    if str(rank) not in pids:
        ranks = sorted(int(r) for r in pids if r.isdigit())
        raise NotFound(f"job {job_id} has no rank {rank} on this server's host"
                       + (f" (its ranks here: {', '.join(map(str, ranks))})" if ranks else
                          " (its workers run on other nodes, where a shell cannot reach yet)"))
    try:
        sandboxed = bool(folder.read_spec().get("sandbox"))
    except (OSError, ValueError):
        raise Conflict(f"job {job_id} is starting: try again in a moment") from None
    pid = worker_process(int(pids[str(rank)]), sandboxed)
    if pid is None:
        raise Conflict(f"job {job_id}'s rank {rank} is not running now (starting, or ending): try again")
    return pid
