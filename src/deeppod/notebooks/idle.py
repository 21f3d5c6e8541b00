"""Idle notebooks give their GPUs back: one whose kernels and terminals have done nothing for its
idle limit is stopped as a user's stop would (resumable, its files kept), so a notebook never
holds a share of the cluster past it. The leader reads each running notebook's activity from its
Jupyter server every DEEPPOD_NOTEBOOK_IDLE_INTERVAL seconds."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from deeppod.contract import JobState
from deeppod.errors import Unavailable
from deeppod.jobs.stopping import request_stop
from deeppod.notebooks import upstream
from deeppod.notebooks.service import KIND
from deeppod.store.models import Job, utcnow
from deeppod.units import duration_text

log = logging.getLogger(__name__)

# job -> when its kernels or terminals were last active (None: never; Unavailable: no answer)
Activity = Callable[[Job, datetime], datetime | None]


def served_activity(job: Job, now: datetime) -> datetime | None:
    """What the notebook's own Jupyter server says (upstream.last_activity)."""
    return upstream.last_activity(job.id, job.workdir, now)


def cull(session: Session, activity: Activity, now: datetime | None = None) -> list[int]:
    """Ask every running notebook idle past its limit to stop; returns their ids. Idle since
    the later of its start and its last activity; one whose server does not answer is left
    alone this round (it may still be starting)."""
    now = now or utcnow()
    stopped = []
    for job in session.scalars(select(Job).where(Job.kind == KIND, Job.state == JobState.RUNNING,
                                                 Job.stop_requested_at.is_(None),
                                                 Job.idle_limit_seconds.is_not(None)).order_by(Job.id)):
        try:
            last = activity(job, now)
        except Unavailable as exc:
            log.info("notebook %d: activity unknown this round (%s)", job.id, exc)
            continue
        since = max((t for t in (job.started_at, last) if t is not None), default=now)
        if (now - since).total_seconds() < job.idle_limit_seconds:
            continue
        limit = duration_text(job.idle_limit_seconds)
        request_stop(session, job, f"idle: no kernel or terminal activity for {limit}; its files are kept, "
                                   f"'deeppod notebook start --resume {job.id}' brings it back",
                     event="idle-stop", told=f"no kernel or terminal activity for {limit}: stopping it to give its "
                                             "GPUs back")
        stopped.append(job.id)
    return stopped


def idle_round(sessions, activity: Activity = served_activity) -> list[int]:
    """One round of the leader's loop, in a transaction of its own."""
    with sessions.begin() as s:
        stopped = cull(s, activity)
    if stopped:
        log.info("stopped idle notebooks %s", ", ".join(map(str, stopped)))
    return stopped
