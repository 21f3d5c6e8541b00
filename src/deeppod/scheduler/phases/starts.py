"""Starts, tenant by tenant, neediest first; each tenant's queue in order until one of its
jobs starts (then the tenants are ranked again). Tenants below their guarantee go first, by
how far below; GPUs beyond the guarantees go (plan ``surplus: service``) to the tenant whose
next job has the lowest service class, then the earliest submit time, or (``share``) to the
tenant furthest below its entitlement. Whole gangs only; a blocked large job gets a
reservation of whole nodes and smaller jobs backfill elsewhere."""

from __future__ import annotations

import heapq

from deeppod.scheduler.pool import FreePool
from deeppod.scheduler.round_state import RoundState, slots
from deeppod.scheduler.snapshot import PendingJob, Snapshot, Start, Wait


def run(st: RoundState) -> None:
    st.nonlendable = st.tenants.nonlendable_idle()
    heap = [start_rank(st, t) for t in st.queues]
    heapq.heapify(heap)
    pos = {t: 0 for t in st.queues}
    st.reserved = False
    cpu_only = st.cpu_only
    st.failed_need = {}  # (GPUs per worker, GPU MiB) -> smallest gang unplaced
    waited = {w.job_id for w in st.out.waits}
    st.reported = {t for t, q in st.queues.items() if q[0].id in waited}
    while heap:
        t = heapq.heappop(heap)[-1]
        q = st.queues[t]
        least = st.least_needs(t)
        while pos[t] < len(q):
            job = q[pos[t]]
            pos[t] += 1
            if _try_start(st, t, job):
                heapq.heappush(heap, start_rank(st, t, pos[t]))
                break
            # none of the rest can start when each asks for more GPUs than the tenant may
            # use (_try_start's first test; only a held node given back could change that)
            # and its first waiting job has been told why (no reason is left to give)
            if least is not None and pos[t] < len(q) and least[pos[t]] > max(0.0, st.free_for(t)) \
                    and t in st.reported and t not in st.node_hold:
                break
        if st.pool.total_free <= 0 and not cpu_only and not st.node_hold:
            break
    started = {s.job_id for s in st.out.starts}
    for t, q in st.queues.items():
        if t in st.reported:
            continue
        first = next((j for j in q if j.id not in started), None)
        if first is not None:
            need = first.min_workers * first.gpus_per_worker
            st.out.waits.append(Wait(first.id, f"waiting for {need} GPUs ({max(0, st.pool.total_free)} free)"))


def start_rank(st: RoundState, t: str, i: int = 0) -> tuple:
    """Where tenant ``t`` comes in the order of starts, with ``queues[t][i]`` its next job."""
    if st.tenants.usage[t] < st.tenants.guaranteed[t]:
        return 0, st.share_used(t), 0.0, t
    q = st.queues[t]
    if st.snap.plan.surplus == "share":
        return 1, st.share_used(t), 0.0, t
    if i >= len(q):
        return 2, 0, 0.0, t
    return 1, st.waiting_class(q[i]), q[i].submitted_at, t


def _try_start(st: RoundState, t: str, job: PendingJob) -> bool:
    """Place ``job`` if it may start now; otherwise, if it is the first of its tenant not to
    start, say why it waits."""
    tenants, pool = st.tenants, st.pool
    hold = st.node_hold.get(t)
    if hold is not None and hold[0] == job.id:
        del st.node_hold[t]
        pool.release(hold[1])
        st.failed_need.clear()  # the pool just grew: what did not fit before may fit now
    per_worker = job.gpus_per_worker
    need = job.min_workers * per_worker
    is_head = t not in st.reported  # the first job of its tenant that does not start gets the reason
    borrowing = tenants.usage[t] + need > tenants.guaranteed[t]
    usable = st.free_for(t) - (st.nonlendable if borrowing else 0)
    if t in st.reclaim_for and job.id not in st.reclaim_for[t]:
        usable -= st.held_for[t]  # reclaimed GPUs are for the jobs they were reclaimed for
    if need > tenants.cap_room(t):
        if is_head:
            _wait(st, t, job, f"tenant {t} is at its max ({tenants.usage[t]:g} GPUs in use); "
                              "it starts when the tenant's own jobs end")
        return False
    shape = (per_worker, job.gpu_memory_mb)  # gangs of this shape larger than a failed one fail too
    if job.gpu_memory_mb and 0 < need <= usable and st.failed_need.get(shape, 1 << 30) > job.min_workers:
        usable = min(usable, st.pool.free_with(job.gpu_memory_mb))  # the rest are too small for it
    if need > 0 and (need > usable or st.failed_need.get(shape, 1 << 30) <= job.min_workers):
        if is_head:
            _wait_for_gpus(st, t, job, need, usable, borrowing)
        return False
    top = job.resize_to or job.top_workers
    if per_worker:
        fair_room = slots(st.entitled.get(t, 0) - tenants.usage[t], per_worker)
        top = max(job.min_workers, min(top, fair_room, slots(tenants.cap_room(t), per_worker),
                                       slots(usable, per_worker)))
    placement = pool.place(top, per_worker, job.cpus_per_worker, job.memory_mb_per_worker, job.avoid,
                           job.gpu_memory_mb)
    if placement is None and top != job.min_workers:
        placement = pool.place(job.min_workers, per_worker, job.cpus_per_worker, job.memory_mb_per_worker,
                               job.avoid, job.gpu_memory_mb)
    if placement is None:
        st.failed_need[shape] = min(st.failed_need.get(shape, 1 << 30), job.min_workers)
        if is_head:
            _wait(st, t, job, pool.shortage(job.min_workers, per_worker, job.cpus_per_worker,
                                            job.memory_mb_per_worker, job.gpu_memory_mb))
        return False
    gpus = len(placement) * per_worker
    st.held_for[t] = max(0.0, st.held_for[t] - gpus)
    tenants.add(t, gpus)
    borrowed = max(0.0, tenants.usage[t] - tenants.guaranteed[t])
    mine = set(tenants.chain(t))
    # someone it could borrow from
    lender = any(g > 0 for name, g in tenants.guaranteed.items() if name not in mine)
    why = ("within guarantee" if borrowed == 0 else f"borrowing {borrowed:g} idle GPUs" if lender else
           "on free GPUs (no plan guarantees them to another tenant)")
    st.out.starts.append(Start(job.id, placement, why + pool.links_note(placement)))
    return True


def _wait(st: RoundState, t: str, job: PendingJob, why: str) -> None:
    st.reported.add(t)
    st.out.waits.append(Wait(job.id, why))


def _wait_for_gpus(st: RoundState, t: str, job: PendingJob, need: int, usable: float, borrowing: bool) -> None:
    """Not enough GPUs: the first big job that has waited long enough, and that its tenant
    deserves, gets a reservation of whole nodes while smaller jobs backfill elsewhere."""
    reachable = st.capacity - (st.nonlendable if borrowing else 0)
    deserved = max(st.tenants.guaranteed[t], st.entitled.get(t, 0)) - st.tenants.usage[t]
    with_ = f" with {job.gpu_memory_mb} MiB each" if job.gpu_memory_mb else ""
    if (not st.reserved and job.gpus_per_worker and st.now - job.submitted_at >= st.cfg.reserve_after_seconds
            and need <= reachable and need <= deserved + 1e-9):
        held = _reserve(st.pool, st.snap, need, limit=int(st.avail()), gmem=job.gpu_memory_mb)
        st.reserved = True
        _wait(st, t, job, f"waiting for {need} GPUs{with_}; {held} free GPUs are reserved "
                          "for it and smaller jobs backfill elsewhere")
    else:
        _wait(st, t, job, f"waiting for {need} GPUs{with_} ({max(0, int(usable))} free)")


def _reserve(pool: FreePool, snap: Snapshot, need: int, limit: int, gmem: int = 0) -> int:
    """Hold the free GPUs of the nodes that will first add up to ``need`` (at most ``limit``:
    those earmarked for a reclaiming tenant are not taken; only nodes whose GPUs have ``gmem``
    MiB each): the big job collects them round after round while smaller jobs backfill."""
    # the fullest nodes first, then by index: the buckets from the top, each in index order
    # (as a sort of every node would give, without one: this stops after a few nodes)
    order = (i for k in range(len(pool.buckets) - 1, -1, -1) for i in sorted(pool.buckets[k]))
    held, capacity = 0, 0
    for i in order:
        if capacity >= need:
            break
        if not pool.gpus_fit(i, gmem):
            continue
        n = snap.nodes[i]  # the pool's nodes are the snapshot's, in order
        capacity += n.total_gpus if n.total_gpus is not None else len(n.free_gpus)
        gpus = list(pool.free[i])[: max(0, limit - held)]
        if gpus:
            pool.take(i, gpus, 0, 0)
            held += len(gpus)
    return held
