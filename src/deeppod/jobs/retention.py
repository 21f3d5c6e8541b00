"""Removing finished jobs' folders (logs, checkpoints, outputs): by hand ('deeppod jobs rm',
'deeppod jobs purge') and by the retention setting. The job's record and events stay, so
history and model lineage keep their job ids."""

from __future__ import annotations

import logging
import shutil
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from deeppod.auth import scope
from deeppod.auth.service import Principal
from deeppod.contract import FINAL_STATES, JobState
from deeppod.errors import Conflict
from deeppod.job_folder import JobFolder
from deeppod.jobs.service import add_event, manage_job
from deeppod.nofollow import tree_bytes
from deeppod.store.models import Job, utcnow

log = logging.getLogger(__name__)


def _remove(session: Session, job: Job, jobs_dir: Path, why: str) -> int:
    folder = JobFolder.of(jobs_dir, job.id).root
    size = tree_bytes(folder, allocated=False)
    shutil.rmtree(folder, ignore_errors=True)  # through descriptors: a link in it is removed, not followed
    job.purged_at = utcnow()
    add_event(session, job, "purged", f"{why}; {size / 1e6:.1f} MB freed")
    return size


def _ended_before(cutoff: datetime):
    """Finished jobs with a folder, ended before ``cutoff``; stopped ones keep theirs (resumable)."""
    return select(Job).where(Job.state.in_(FINAL_STATES), Job.state != JobState.STOPPED, Job.purged_at.is_(None),
                             Job.ended_at <= cutoff).order_by(Job.id)


def purge(session: Session, principal: Principal, job_id: int, jobs_dir: Path, *, force: bool = False) -> int:
    """Remove one finished job's folder; returns the bytes freed."""
    job = manage_job(session, principal, job_id, "remove the files of")
    if job.state not in FINAL_STATES:
        raise Conflict(f"job {job_id} is {job.state}: cancel it first ('deeppod cancel {job_id}'), then remove it")
    if job.state == JobState.STOPPED and not force:
        raise Conflict(f"job {job_id} is stopped: its checkpoint is in its folder and 'deeppod resume {job_id}' "
                       "needs it; pass --force to remove it anyway")
    if job.purged_at is not None:
        return 0
    return _remove(session, job, jobs_dir, f"files removed by {principal.user}")


def purge_finished(session: Session, principal: Principal, jobs_dir: Path, *, older_than: timedelta,
                   now: datetime | None = None) -> tuple[list[int], int]:
    """Remove the folders of the caller's tenant's jobs (every tenant's for admins) that
    ended more than ``older_than`` ago. Stopped jobs keep theirs (they can be resumed)."""
    cutoff = (now or utcnow()) - older_than
    q = scope.visible(_ended_before(cutoff), Job, principal)
    if not principal.may_manage(-1):  # members: only their own
        q = q.where(Job.user_id == principal.user_id)
    ids, freed = [], 0
    for job in session.scalars(q):
        freed += _remove(session, job, jobs_dir,
                         f"files removed by {principal.user} (ended before {cutoff:%Y-%m-%d %H:%M})")
        ids.append(job.id)
    return ids, freed


def apply_retention(sessions: sessionmaker, jobs_dir: Path, days: float, now: datetime | None = None) -> list[int]:
    """DEEPPOD_JOB_RETENTION_DAYS: remove folders of jobs that ended longer ago (0 keeps all)."""
    if days <= 0:
        return []
    cutoff = (now or utcnow()) - timedelta(days=days)
    with sessions.begin() as s:
        jobs = list(s.scalars(_ended_before(cutoff).limit(500)))  # a bounded batch a minute
        for job in jobs:
            _remove(s, job, jobs_dir, f"files removed after {days:g} days (DEEPPOD_JOB_RETENTION_DAYS)")
        return [j.id for j in jobs]
