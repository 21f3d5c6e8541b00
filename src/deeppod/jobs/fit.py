"""A submitted job that can never start where it is (scheduler/fit.py) is warned of in the
submit answer, not left to wait in silence."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from deeppod.cluster.service import NodeUsage, usage_of
from deeppod.contract import HOLDING_STATES
from deeppod.scheduler.fit import Ask, Room, never_fits
from deeppod.store.models import Job, Node


def warning(session: Session, job: Job) -> str | None:
    """Why ``job`` can never start beside the work that is never preempted, or None."""
    held = usage_of(session.scalars(select(Job).where(Job.state.in_(HOLDING_STATES), Job.preemptible.is_(False),
                                                      Job.id != job.id)))
    rooms = []
    for n in session.scalars(select(Node).where(Node.burst.is_(None))):  # burst nodes come and go
        u = held.get(n.name) or NodeUsage(set())
        rooms.append(Room(n.name, sum(1 for g in n.gpus if g.get("healthy", True)), n.cpus, n.memory_mb,
                          len(u.gpus), u.cpus, u.memory_mb))
    return never_fits(Ask(job.workers, job.gpus_per_worker, job.cpus_per_worker, job.memory_mb_per_worker or 0),
                      rooms)
