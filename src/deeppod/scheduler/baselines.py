"""Baseline policies for the simulator and benchmarks, on the same snapshot and decisions.

- ``fifo``: one queue for everyone in priority and arrival order; the head is never
  overtaken; no tenant plan, no preemption, no elasticity (jobs run at their minimum).
- ``static``: each tenant may use only its guarantee (a hard partition); FIFO per tenant.
  A job larger than its tenant's whole guarantee may run alone, when the tenant has
  nothing else running (otherwise it could never run at all).
"""

from __future__ import annotations

from collections import defaultdict

from deeppod.scheduler.pool import FreePool
from deeppod.scheduler.snapshot import Decisions, Snapshot, Start, Wait


def fifo(snap: Snapshot) -> Decisions:
    out = Decisions()
    pool = FreePool(snap.nodes)
    for job in sorted(snap.queued, key=lambda j: (-j.priority, j.submitted_at, j.id)):
        placement = pool.place(job.min_workers, job.gpus_per_worker, job.cpus_per_worker, job.memory_mb_per_worker)
        if placement is None:
            out.waits.append(Wait(job.id, "behind the head of the FIFO queue"))
            break
        out.starts.append(Start(job.id, placement, "fifo"))
    return out


def static(snap: Snapshot) -> Decisions:
    out = Decisions()
    pool = FreePool(snap.nodes)
    limit = {n.name: n.guaranteed for n, _, _ in snap.plan.walk() if not n.children}
    used: dict[str, int] = defaultdict(int)
    for job in snap.running:
        used[job.tenant] += job.gpus
    blocked: set[str] = set()
    for job in sorted(snap.queued, key=lambda j: (-j.priority, j.submitted_at, j.id)):
        if job.tenant in blocked:
            continue
        need = job.min_workers * job.gpus_per_worker
        placement = None
        alone = used[job.tenant] == 0 and need > limit.get(job.tenant, 0)
        if used[job.tenant] + need <= limit.get(job.tenant, 0) or alone:
            placement = pool.place(job.min_workers, job.gpus_per_worker, job.cpus_per_worker, job.memory_mb_per_worker)
        if placement is None:
            blocked.add(job.tenant)
            out.waits.append(Wait(job.id, f"tenant {job.tenant} has only its guarantee"))
            continue
        used[job.tenant] += need
        out.starts.append(Start(job.id, placement, "static"))
    return out


POLICIES = {"fifo": fifo, "static": static}
