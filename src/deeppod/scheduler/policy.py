"""One scheduling round of DeepPod's multi-tenant policy. Pure: snapshot in, decisions out.

Order of business in a round:

1. jobs on unhealthy nodes are preempted (they requeue and avoid the node);
2. guarantee reclaim: a tenant below its guarantee with waiting work gets GPUs back from
   tenants above theirs, first by shrinking elastic jobs toward their minimum (never
   below the donor's guarantee), then by preempting jobs, least work lost first: first
   those whose loss keeps the donor at or above its guarantee, then (only if needed)
   jobs that run by borrowing (in start order, past the donor's guarantee);
3. fair-share contention: a tenant below its weighted fair share shrinks (never preempts)
   elastic jobs of tenants above theirs;
4. within a tenant, a higher-priority job may preempt lower-priority ones;
5. starts, tenant by tenant in order of how far each is below its entitlement, each
   tenant's queue by aged priority then submit time; whole gangs only; a blocked
   large job gets a reservation of whole nodes and smaller jobs backfill elsewhere;
6. idle GPUs grow elastic jobs toward their maximum.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict

from deeppod.scheduler.plan import entitlements
from deeppod.scheduler.pool import FreePool
from deeppod.scheduler.snapshot import (Decisions, PendingJob, Preempt, Resize, RunningJob, Snapshot, Start,
                                        Wait)


class _Tenants:
    """Per-tenant accounting along the plan tree (usage counts against every ancestor)."""

    def __init__(self, snap: Snapshot, tenants: set[str]):
        self.parent: dict[str, str | None] = {}
        self.g: dict[str, float] = {}
        self.max: dict[str, float] = {}
        self.lend: dict[str, float | None] = {}
        for node, parent, _ in snap.plan.walk():
            self.parent[node.name] = parent
            self.g[node.name] = node.guaranteed
            self.max[node.name] = math.inf if node.max is None else node.max
            self.lend[node.name] = node.lend_limit
        for t in tenants:
            if t not in self.parent:
                self.parent[t], self.g[t], self.max[t], self.lend[t] = None, 0, math.inf, None
        self.usage: dict[str, float] = defaultdict(float)

    def chain(self, t: str):
        while t is not None:
            yield t
            t = self.parent[t]

    def add(self, t: str, gpus: float) -> None:
        for a in self.chain(t):
            self.usage[a] += gpus

    def cap_room(self, t: str) -> float:
        return min(self.max[a] - self.usage[a] for a in self.chain(t))

    def above_guarantee(self, t: str) -> float:
        """GPUs ``t`` could give up without it (or an ancestor) dropping below a guarantee."""
        return min(self.usage[a] - self.g[a] for a in self.chain(t))

    def nonlendable_idle(self) -> float:
        total = 0.0
        for t, limit in self.lend.items():
            if limit is not None:
                idle = self.g[t] - self.usage[t]
                total += max(0.0, idle - limit)
        return total


def _slots(gpus: float, per: int) -> int:
    """Whole workers of ``per`` GPUs that fit in ``gpus`` (which may be infinite)."""
    return 1 << 30 if math.isinf(gpus) else int(gpus // per)


def effective_priority(job: PendingJob, now: float, aging_seconds: float) -> int:
    if aging_seconds <= 0:
        return job.priority
    return job.priority + int(max(0.0, now - job.submitted_at) // aging_seconds)


def borrowing_jobs(running: list[RunningJob], guaranteed: dict[str, float]) -> set[int]:
    """Jobs that run only by borrowing: in start order, a tenant's jobs up to its guarantee
    are its own; the one that crosses it, and those after, borrow (Kueue's semantics)."""
    used: dict[str, float] = defaultdict(float)
    out = set()
    for job in sorted(running, key=lambda j: (j.started_at, j.id)):
        used[job.tenant] += job.gpus
        if used[job.tenant] > guaranteed.get(job.tenant, 0):
            out.add(job.id)
    return out


def _loss_key(job: RunningJob, now: float):
    """Victim order: least work lost, lowest priority, most recently started."""
    since = job.last_checkpoint_at if job.last_checkpoint_at is not None else job.started_at
    return (max(0.0, now - since), job.priority, -job.started_at, job.id)


def schedule(snap: Snapshot) -> Decisions:
    cfg, now = snap.config, snap.now
    out = Decisions()
    pool = FreePool(snap.nodes)
    healthy = {n.name for n in snap.nodes if n.healthy}
    tenant_names = {j.tenant for j in snap.queued} | {j.tenant for j in snap.running}
    T = _Tenants(snap, tenant_names)

    running = list(snap.running)
    stopping_gpus = 0
    for job in running:
        T.add(job.tenant, job.gpus)
        if job.stopping:
            stopping_gpus += sum(len(w.gpus) for w in job.placement if w.node in healthy)
    capacity = pool.total_free + sum(len(w.gpus) for j in running for w in j.placement if w.node in healthy)

    # 1. health
    gone: set[int] = set()
    sick = {(n.name, g) for n in snap.nodes for g in n.sick_gpus}
    for job in running:
        if job.stopping:
            continue
        bad = sorted({w.node for w in job.placement} - healthy)
        bad_gpu = sorted((w.node, g) for w in job.placement for g in w.gpus if (w.node, g) in sick)
        if bad:
            out.preempts.append(Preempt(job.id, f"node {bad[0]} is unhealthy; the job is requeued on healthy nodes"))
            gone.add(job.id)
        elif bad_gpu:
            out.preempts.append(Preempt(job.id, f"GPU {bad_gpu[0][1]} of node {bad_gpu[0][0]} is unhealthy; "
                                                "the job is requeued on healthy GPUs"))
            gone.add(job.id)

    queues: dict[str, list[PendingJob]] = defaultdict(list)
    for job in snap.queued:
        queues[job.tenant].append(job)
    for q in queues.values():
        q.sort(key=lambda j: (-effective_priority(j, now, cfg.aging_seconds), j.submitted_at, j.id))

    demand: dict[str, float] = defaultdict(float)
    for job in running:
        demand[job.tenant] += job.gpus
        if not job.stopping and job.max_workers > job.workers:
            demand[job.tenant] += (job.max_workers - job.workers) * job.gpus_per_worker
    for t, q in queues.items():
        demand[t] += sum((j.resize_to or j.top_workers) * j.gpus_per_worker for j in q)
    ent = entitlements(snap.plan, demand, capacity)

    victims_by_tenant: dict[str, list[RunningJob]] = defaultdict(list)
    for job in running:
        if job.preemptible and not job.stopping and job.id not in gone:
            victims_by_tenant[job.tenant].append(job)
    borrowers = borrowing_jobs(running, T.g)
    planned: dict[int, int] = {}  # job id -> size a shrink in this round asked for
    reclaim_for: dict[str, int] = {}  # tenant -> the job its earmarked GPUs are for
    leaving: set[int] = set()  # jobs evicted in this round
    lost_own: set[str] = set()  # tenants that lost a job running within their guarantee this round
    claimed_incoming = 0.0  # GPUs already on their way back, spoken for by an earlier reclaim
    held_for: dict[str, float] = defaultdict(float)  # free GPUs earmarked for a reclaiming tenant

    def free_for(t: str) -> float:
        """Free GPUs tenant ``t`` may use: all but those earmarked for other tenants."""
        return pool.total_free - sum(v for k, v in held_for.items() if k != t)

    def avail() -> float:
        """Free GPUs nobody has earmarked."""
        return max(0.0, pool.total_free - sum(held_for.values()))

    def take_back(t: str, head: PendingJob, floor_of, allow_preempt: bool, why: str) -> bool:
        """Make room for ``head`` of tenant ``t``: free GPUs, GPUs already on their way
        back, then elastic shrinks, then (if allowed) whole-job preemptions."""
        nonlocal claimed_incoming, stopping_gpus
        need = head.min_workers * head.gpus_per_worker
        if head.gpus_per_worker > 1:
            return allow_preempt and take_back_nodes(t, head, floor_of, why)
        now_free = min(need, avail())
        short = need - now_free
        incoming = max(0.0, stopping_gpus - claimed_incoming)
        if short > incoming:
            deficit = short - incoming
            donors = [v for v in victims_by_tenant if v != t and
                      (floor_of(v) > 0 or (allow_preempt and any(j.id in borrowers for j in victims_by_tenant[v])))]
            shrinks, preempts = [], []
            for v in donors:
                for job in victims_by_tenant[v]:
                    size = planned.get(job.id, job.workers)
                    if job.max_workers > job.min_workers and size > job.min_workers and job.gpus_per_worker:
                        if allow_preempt or now - job.started_at >= cfg.min_run_before_resize:
                            shrinks.append(job)
                    if allow_preempt and job.gpus:
                        preempts.append(job)
            shrinks.sort(key=lambda j: _loss_key(j, now))
            preempts.sort(key=lambda j: _loss_key(j, now))
            resize: dict[int, int] = {}
            evict: list[RunningJob] = []
            gained = 0.0
            budget = {v: floor_of(v) for v in donors}
            for job in shrinks:
                if gained >= deficit:
                    break
                gpw, size = job.gpus_per_worker, planned.get(job.id, job.workers)
                spare = min(size - job.min_workers, _slots(budget[job.tenant], gpw), math.ceil((deficit - gained) / gpw))
                if spare > 0:
                    resize[job.id] = size - spare
                    budget[job.tenant] -= spare * gpw
                    gained += spare * gpw
            # First evictions that leave their tenant at or above its guarantee; only then
            # borrowing gangs that take it below (it would come back asking for its own).
            own = set(lost_own)
            for crossing in (False, True):
                for job in preempts:
                    if gained >= deficit:
                        break
                    if job in evict:
                        continue
                    rest = resize.get(job.id, planned.get(job.id, job.workers)) * job.gpus_per_worker
                    if (rest > budget[job.tenant]) != crossing:
                        continue
                    if crossing and (job.id not in borrowers or job.tenant in own):
                        continue  # it runs within its tenant's guarantee, or the tenant gave one up already
                    if job.id not in borrowers:
                        own.add(job.tenant)
                    resize.pop(job.id, None)
                    evict.append(job)
                    budget[job.tenant] -= rest
                    gained += rest
            if gained < deficit:
                return False
            for job in evict:
                leaving.add(job.id)
                if job.id not in borrowers:
                    lost_own.add(job.tenant)
                out.preempts.append(Preempt(job.id, why))
                out.resizes[:] = [r for r in out.resizes if r.job_id != job.id]  # a shrink becomes an eviction
                victims_by_tenant[job.tenant].remove(job)
                T.add(job.tenant, -planned.pop(job.id, job.workers) * job.gpus_per_worker)
            for job in running:
                if job.id in resize:
                    new, size = resize[job.id], planned.get(job.id, job.workers)
                    out.resizes[:] = [r for r in out.resizes if r.job_id != job.id]
                    out.resizes.append(Resize(job.id, new, f"shrink from {job.workers} to {new} workers: {why}"))
                    planned[job.id] = new  # it stays a candidate: a later reclaim may shrink or evict it
                    T.add(job.tenant, -(size - new) * job.gpus_per_worker)
            stopping_gpus += gained  # on their way back now; what this tenant does not need, the next may use
        claimed_incoming += short
        held_for[t] += now_free
        return True

    def take_back_nodes(t: str, head: PendingJob, floor_of, why: str) -> bool:
        """Reclaim for workers of several GPUs each, which need that many free on one node:
        clear the nodes that cost least (fewest jobs, least progress lost), counting GPUs
        already on their way back as free, never taking a donor below its floor."""
        gpw = head.gpus_per_worker
        free_on = [len(f) for f in pool.free]
        on_node: dict[int, list[RunningJob]] = defaultdict(list)
        for job in running:
            for w in job.placement:
                i = pool.index.get(w.node)
                if i is None:
                    continue
                if job.stopping or job.id in leaving:
                    free_on[i] += len(w.gpus)
                elif job.preemptible and job.id not in gone and job.tenant != t and job in victims_by_tenant[job.tenant]:
                    if job not in on_node[i]:
                        on_node[i].append(job)
        slots = sum(f // gpw for i, f in enumerate(free_on) if pool.names[i] in healthy)
        missing = head.min_workers - slots
        if missing <= 0:
            if sum(len(pool.free[i]) // gpw for i in range(len(pool.names))) >= head.min_workers:
                held_for[t] += min(head.min_workers * gpw, avail())  # it can start now: keep them for it
            return True
        budget = {v: floor_of(v) for v in victims_by_tenant if v != t}
        chosen: list[RunningJob] = []
        for _ in range(missing):
            best = None
            for i, jobs in on_node.items():
                want = gpw - free_on[i] % gpw
                picked, freed, spent = [], 0, defaultdict(float)
                own_here = {j.tenant for j in chosen if j.id not in borrowers}
                for job in sorted(jobs, key=lambda j: _loss_key(j, now)):
                    if freed >= want or job in chosen:
                        continue
                    within = job.gpus + spent[job.tenant] <= budget.get(job.tenant, 0)
                    if job.id not in borrowers and not within:
                        continue  # it runs within its tenant's guarantee
                    if not within and (job.tenant in lost_own or job.tenant in own_here):
                        continue  # the tenant gives up a job of its own here: nothing past its guarantee
                    if job.id not in borrowers:
                        own_here.add(job.tenant)
                    here = sum(len(w.gpus) for w in job.placement if w.node == pool.names[i])
                    picked.append(job)
                    spent[job.tenant] += job.gpus
                    freed += here
                if freed >= want:
                    cost = (len(picked), sum(j.gpus for j in picked), [_loss_key(j, now) for j in picked])
                    if best is None or cost < best[0]:
                        best = (cost, picked)
            if best is None:
                return False
            for job in best[1]:
                chosen.append(job)
                budget[job.tenant] -= job.gpus
                for w in job.placement:
                    i = pool.index.get(w.node)
                    if i is not None:
                        free_on[i] += len(w.gpus)
                        if job in on_node[i]:
                            on_node[i].remove(job)
        for job in chosen:
            out.preempts.append(Preempt(job.id, why))
            out.resizes[:] = [r for r in out.resizes if r.job_id != job.id]
            leaving.add(job.id)
            if job.id not in borrowers:
                lost_own.add(job.tenant)
            victims_by_tenant[job.tenant].remove(job)
            T.add(job.tenant, -planned.pop(job.id, job.workers) * job.gpus_per_worker)
        # nothing held: the GPUs it needs are on the nodes being cleared, not the free ones
        return True

    # 2. guarantee reclaim, neediest tenant first
    reclaiming = sorted((t for t in queues if T.usage[t] < T.g[t]), key=lambda t: (T.usage[t] / max(T.g[t], 1e-9), t))
    for t in reclaiming:
        # Jobs that fit in what is left of the guarantee, in queue order: bigger ones may
        # borrow, not reclaim. If the first cannot be served (no node can be cleared for
        # it), the next size is tried, so one stuck gang does not hold the whole tenant.
        tried: set[tuple[int, int]] = set()
        for head in queues[t]:
            need = head.min_workers * head.gpus_per_worker
            shape = (head.min_workers, head.gpus_per_worker)
            if not 0 < need <= T.g[t] - T.usage[t] or shape in tried:
                continue
            tried.add(shape)
            why = (f"reclaim for tenant {t}: it uses {T.usage[t]:g} of its {T.g[t]:g} guaranteed GPUs "
                   f"and job {head.id} waits for {need}")
            if take_back(t, head, T.above_guarantee, True, why):
                reclaim_for[t] = head.id
                break
            if len(tried) == 1:
                out.waits.append(Wait(head.id, f"tenant {t} is below its guarantee; no jobs can be preempted "
                                               "to make room for this gang yet"))
            if len(tried) >= 3:
                break

    # 3. fair-share contention: shrink (never preempt) tenants above their share
    for t in sorted(queues, key=lambda t: (T.usage[t] / max(ent.get(t, 0), 1e-9), t)):
        head = queues[t][0]
        need = head.min_workers * head.gpus_per_worker
        if need == 0 or held_for[t] >= need or T.usage[t] + need > ent.get(t, 0) + 1e-9:
            continue
        if avail() + held_for[t] >= need:
            continue
        take_back(t, head, lambda v: min(T.usage[v] - ent.get(v, 0), T.above_guarantee(v)), False,
                  f"fair share for tenant {t}: job {head.id} waits and it is below its share")

    # 4. priority within a tenant
    if cfg.priority_preemption:
        for t, q in queues.items():
            head = q[0]
            need = head.min_workers * head.gpus_per_worker
            if need == 0 or avail() + held_for[t] >= need:
                continue
            lower = sorted((j for j in victims_by_tenant.get(t, []) if j.priority < head.priority),
                           key=lambda j: (j.priority, *_loss_key(j, now)))
            short, chosen = need - avail() - held_for[t], []
            for job in lower:
                if short <= 0:
                    break
                chosen.append(job)
                short -= planned.get(job.id, job.workers) * job.gpus_per_worker
            if short <= 0:
                for job in chosen:
                    out.preempts.append(Preempt(job.id, f"job {head.id} of tenant {t} has higher priority "
                                                        f"({head.priority} > {job.priority})"))
                    out.resizes[:] = [r for r in out.resizes if r.job_id != job.id]
                    victims_by_tenant[t].remove(job)
                    T.add(t, -planned.pop(job.id, job.workers) * job.gpus_per_worker)
                held_for[t] += min(need, avail())

    # 5. starts
    nonlendable = T.nonlendable_idle()
    heap = [((0 if T.usage[t] < T.g[t] else 1), T.usage[t] / max(ent.get(t, 0), 1e-9), t) for t in queues]
    heapq.heapify(heap)
    pos = {t: 0 for t in queues}
    reserved = False
    cpu_only = any(j.gpus_per_worker == 0 for j in snap.queued)
    failed_need: dict[int, int] = {}  # gpus_per_worker -> smallest gang that did not fit this round
    reported = {t for t, q in queues.items() if any(w.job_id == q[0].id for w in out.waits)}
    while heap:
        _, _, t = heapq.heappop(heap)
        q = queues[t]
        while pos[t] < len(q):
            job = q[pos[t]]
            pos[t] += 1
            gpw = job.gpus_per_worker
            need = job.min_workers * gpw
            is_head = t not in reported  # the first job of its tenant that does not start gets the reason
            borrowing = T.usage[t] + need > T.g[t]
            usable = free_for(t) - (nonlendable if borrowing else 0)
            if reclaim_for.get(t, job.id) != job.id:
                usable -= held_for[t]  # reclaimed GPUs are for the job they were reclaimed for
            if need > T.cap_room(t):
                if is_head:
                    reported.add(t)
                    out.waits.append(Wait(job.id, f"tenant {t} is at its max ({T.usage[t]:g} GPUs in use); "
                                                  "it starts when the tenant's own jobs end"))
                continue
            if need > 0 and (need > usable or failed_need.get(gpw, 1 << 30) <= job.min_workers):
                if is_head:
                    reported.add(t)
                    reachable = capacity - (nonlendable if borrowing else 0)
                    deserved = max(T.g[t], ent.get(t, 0)) - T.usage[t]
                    if (not reserved and gpw and now - job.submitted_at >= cfg.reserve_after_seconds
                            and need <= reachable and need <= deserved + 1e-9):
                        held = _reserve(pool, snap, need, limit=int(avail()))
                        reserved = True
                        out.waits.append(Wait(job.id, f"waiting for {need} GPUs; {held} free GPUs are reserved "
                                                      "for it and smaller jobs backfill elsewhere"))
                    else:
                        out.waits.append(Wait(job.id, f"waiting for {need} GPUs ({max(0, int(usable))} free)"))
                continue
            top = job.resize_to or job.top_workers
            if gpw:
                fair_room = _slots(ent.get(t, 0) - T.usage[t], gpw)
                top = max(job.min_workers, min(top, fair_room, _slots(T.cap_room(t), gpw), _slots(usable, gpw)))
            placement = pool.place(top, gpw, job.cpus_per_worker, job.memory_mb_per_worker, job.avoid)
            if placement is None and top != job.min_workers:
                placement = pool.place(job.min_workers, gpw, job.cpus_per_worker, job.memory_mb_per_worker, job.avoid)
            if placement is None:
                failed_need[gpw] = min(failed_need.get(gpw, 1 << 30), job.min_workers)
                if is_head:
                    reported.add(t)
                    why = pool.shortage(job.min_workers, gpw, job.cpus_per_worker, job.memory_mb_per_worker)
                    out.waits.append(Wait(job.id, why))
                continue
            gpus = len(placement) * gpw
            held_for[t] = max(0.0, held_for[t] - gpus)
            T.add(t, gpus)
            borrowed = max(0.0, T.usage[t] - T.g[t])
            out.starts.append(Start(job.id, placement, "within guarantee" if borrowed == 0 else
                                    f"borrowing {borrowed:g} idle GPUs"))
            heapq.heappush(heap, ((0 if T.usage[t] < T.g[t] else 1), T.usage[t] / max(ent.get(t, 0), 1e-9), t))
            break
        if pool.total_free <= 0 and not cpu_only:
            break
    started = {s.job_id for s in out.starts}
    for t, q in queues.items():
        if t in reported:
            continue
        first = next((j for j in q if j.id not in started), None)
        if first is not None:
            need = first.min_workers * first.gpus_per_worker
            out.waits.append(Wait(first.id, f"waiting for {need} GPUs ({max(0, pool.total_free)} free)"))

    # 6. grow elastic jobs into GPUs nobody queued can use
    if cfg.grow and pool.total_free > 0:
        growable = [j for t in victims_by_tenant for j in victims_by_tenant[t]
                    if j.id not in planned and j.max_workers > j.workers and j.gpus_per_worker
                    and now - j.started_at >= cfg.min_run_before_resize]
        growable.sort(key=lambda j: (T.usage[j.tenant] / max(ent.get(j.tenant, 0), 1e-9), j.id))
        for job in growable:
            spare = avail()
            extra = min(job.max_workers - job.workers, _slots(spare, job.gpus_per_worker),
                        _slots(T.cap_room(job.tenant), job.gpus_per_worker))
            if extra < max(1, job.workers // 4):
                continue
            trial = pool.copy()
            trial.release(job.placement)
            if trial.place(job.workers + extra, job.gpus_per_worker) is None:
                continue
            pool = trial
            T.add(job.tenant, extra * job.gpus_per_worker)
            out.resizes.append(Resize(job.id, job.workers + extra,
                                      f"grow from {job.workers} to {job.workers + extra} workers into idle GPUs"))
    return out


def _reserve(pool: FreePool, snap: Snapshot, need: int, limit: int) -> int:
    """Hold the free GPUs of the nodes that will first add up to ``need``: the big job
    collects them round after round while smaller jobs backfill on the other nodes.
    At most ``limit`` GPUs: those earmarked for a reclaiming tenant are not taken."""
    order = sorted(range(len(pool.names)), key=lambda i: (-len(pool.free[i]), i))
    totals = {n.name: (n.total_gpus if n.total_gpus is not None else len(n.free_gpus)) for n in snap.nodes}
    held, capacity = 0, 0
    for i in order:
        if capacity >= need:
            break
        capacity += totals.get(pool.names[i], 0)
        gpus = list(pool.free[i])[: max(0, limit - held)]
        if gpus:
            pool.take(i, gpus, 0, 0)
            held += len(gpus)
    return held
