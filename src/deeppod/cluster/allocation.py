"""Who holds which GPU now, and how many GPUs each tenant held over time: the cluster as a
person sees it (the console's cluster page). A member sees other tenants' GPUs as taken,
never by whom (the monitor's rule)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from deeppod.auth import scope
from deeppod.auth.service import Principal
from deeppod.contract import HOLDING_STATES
from deeppod.store.models import Job, Node, Tenant, utcnow

OTHERS = "other tenants"


@dataclass(frozen=True)
class GpuSlot:
    index: int
    state: str  # free, allocated, cordoned, down
    job_id: int | None = None  # None where the caller may not see whose it is
    job_name: str = ""
    tenant: str = ""
    reason: str = ""


def gpu_slots(session: Session, principal: Principal) -> list[tuple[Node, list[GpuSlot]]]:
    """Every node with each of its GPUs' state and holder."""
    held: dict[tuple[str, int], tuple[Job, str]] = {}
    rows = session.execute(select(Job, Tenant.name).join(Tenant, Job.tenant_id == Tenant.id)
                           .where(Job.state.in_(HOLDING_STATES)))
    for job, tenant in rows:
        for w in job.placed_workers:
            for g in w["gpus"]:
                held[(w["node"], g)] = (job, tenant)
    out = []
    for node in session.scalars(select(Node).order_by(Node.name)):
        slots = []
        for g in node.gpus:
            i = g["index"]
            holder = held.get((node.name, i))
            if holder is not None:
                job, tenant = holder
                if scope.may_see(principal, job):
                    slots.append(GpuSlot(i, "allocated", job.id, job.name, tenant))
                else:
                    slots.append(GpuSlot(i, "allocated", tenant=OTHERS))
            elif not node.up:
                slots.append(GpuSlot(i, "down", reason=node.down_reason or "the node left the cluster"))
            elif not node.healthy or not g.get("healthy", True):
                slots.append(GpuSlot(i, "cordoned", reason=g.get("reason") or "cordoned by an administrator"))
            else:
                slots.append(GpuSlot(i, "free"))
        out.append((node, slots))
    return out


def gpus_over_time(session: Session, principal: Principal, hours: float = 24.0, buckets: int = 96) -> dict:
    """GPUs held per tenant in ``buckets`` equal steps over the last ``hours``: each bucket's
    time-weighted mean, from each job's (last) start to its end. A member sees its own tenant
    and the rest as one line. Never before the cluster began (its first node, its first job): a
    server up for 15 minutes charts 15 minutes, not 24 hours of nothing."""
    now = utcnow()
    began = [t for t in (session.scalar(select(func.min(Node.joined_at))),
                         session.scalar(select(func.min(Job.started_at)))) if t is not None]
    since = max(now - timedelta(hours=hours), min([*began, now - timedelta(minutes=1)]))
    step = (now - since) / buckets
    times = [since + step * (i + 1) for i in range(buckets)]
    series: dict[str, list[float]] = defaultdict(lambda: [0.0] * buckets)
    rows = session.execute(
        select(Job, Tenant.name).join(Tenant, Job.tenant_id == Tenant.id)
        .where(Job.started_at.is_not(None), Job.gpus_per_worker > 0,
               or_(Job.ended_at.is_(None), Job.ended_at > since)))
    for job, tenant in rows:
        name = tenant if scope.may_see(principal, job) else OTHERS
        gpus = sum(len(w["gpus"]) for w in job.placed_workers) or job.workers * job.gpus_per_worker
        end: datetime = job.ended_at or now
        for i, t in enumerate(times):
            # time-weighted: the share of the bucket it held them (not 1 for any overlap, which
            # summed many short jobs in one bucket past the cluster's size)
            held = (min(end, t) - max(job.started_at, t - step)) / step
            if held > 0:
                series[name][i] += gpus * held
    return {"t": [t.timestamp() for t in times], "tenants": dict(sorted(series.items()))}
