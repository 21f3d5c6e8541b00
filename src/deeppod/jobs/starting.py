"""Starting a run the policy decided on: stage the job's datasets, make its launch spec, start
its workers, record the handle. No transaction is held while files are copied or workers start
(a Ray launch waits on actors of other nodes, tens of seconds on a busy machine, and every other
writer of the database would wait with it). A server that dies between the launch and the
handle's commit finds the run by its mark at its restart (runs.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from deeppod.cluster.service import mark_down
from deeppod.contract import JobState
from deeppod.errors import DeepPodError, NodeLost, NotLeader
from deeppod.executor.base import Executor
from deeppod.jobs.allocation import Allocation
from deeppod.jobs.launch import Launcher
from deeppod.jobs.runs import requeue
from deeppod.jobs.service import finish
from deeppod.store.models import Job

log = logging.getLogger(__name__)


def start_run(sessions: sessionmaker[Session], fence: Callable[[Session], None], launcher: Launcher,
              executor: Executor, job_id: int) -> None:
    """A failure to stage or start fails the job; a lost node sends it back to wait for others."""
    with sessions.begin() as s:  # its token is committed first: a server killed before the launch's
        fence(s)  # commit finds the job by its folder at its restart, and the job's calls must get in
        job = s.get(Job, job_id)
        wanted, token = list(job.datasets or []), launcher.token(s, job)
    try:
        staged = launcher.stage_datasets(wanted)  # may copy from a cold tier
    except (DeepPodError, OSError) as exc:
        with sessions.begin() as s:
            fence(s)
            finish(s, s.get(Job, job_id), JobState.FAILED, f"could not stage its datasets: {exc}")
        log.warning("job %s could not stage its datasets: %s", job_id, exc)
        return
    spec = failed = handle = None
    with sessions.begin() as s:
        fence(s)
        job = s.get(Job, job_id)
        alloc = Allocation.of(job)
        alloc.staged = staged  # joiners of an in-place grow get it too
        alloc.save(job)
        try:
            spec = launcher.launch_spec(s, job, alloc.workers, staged, token)
        except (DeepPodError, OSError) as exc:
            failed = exc
    try:
        handle = executor.launch(spec) if spec is not None else None
    except NotLeader:  # nothing started: the leader now in charge requeues it
        raise
    except (DeepPodError, OSError) as exc:
        failed = exc
    with sessions.begin() as s:
        fence(s)
        _launched(s, s.get(Job, job_id), handle, failed)


def _launched(s: Session, job: Job, handle: dict | None, failed: Exception | None) -> None:
    if isinstance(failed, NodeLost):  # not the job's fault, and it never ran: it waits for other nodes
        mark_down(s, failed.nodes)
        requeue(s, job, f"requeued: {failed}", ran=False)
    elif failed is not None:
        finish(s, job, JobState.FAILED, f"could not start: {failed}")
        log.warning("job %s could not start: %s", job.id, failed)
    else:
        job.handle = handle
