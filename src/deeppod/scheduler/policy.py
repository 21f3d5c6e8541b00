"""One scheduling round of DeepPod's multi-tenant policy. Pure: snapshot in, decisions out.

Order of business in a round:

1. jobs on unhealthy nodes are preempted (they requeue and avoid the node);
2. guarantee reclaim: a tenant below its guarantee with waiting work gets GPUs back from
   tenants above theirs, first by shrinking elastic jobs toward their minimum (never
   below the donor's guarantee), then by preempting jobs, least work lost first: first
   those whose loss keeps the donor at or above its guarantee, then (only if needed)
   jobs that run by borrowing (in start order, past the donor's guarantee); a gang of
   whole-node workers gets whole nodes: cleared by evicting what borrows there or, if no
   node can be cleared so, by also moving the jobs that run within a guarantee onto free
   GPUs elsewhere (``Config.defragment``), and then held for it, not only counted;
3. fair-share contention: a tenant below its weighted fair share shrinks (never preempts)
   elastic jobs of tenants above theirs;
4. within a tenant, a higher-priority job may preempt lower-priority ones;
5. least attained service (Tiresias): a waiting job of a lower service class shrinks or
   preempts jobs of a higher class, of its own tenant or borrowing from another (never
   below that tenant's guarantee); a run younger than ``min_run_before_las_preempt`` is
   left alone;
6. starts: tenants below their guarantee first, by how far below; then, for GPUs beyond
   the guarantees, the tenant whose next job has the lowest service class, then the
   earliest submit time (plan ``surplus`` ``service``), or the tenant furthest below its
   entitlement (``share``); each tenant's queue by priority (aged up to the queue's top),
   then service class, then submit time; whole gangs only; a blocked large job gets a
   reservation of whole nodes and smaller jobs backfill elsewhere;
7. idle GPUs grow elastic jobs toward their maximum.

Service classes need no run-time estimates: a job's class is how many of
``Config.las_thresholds`` (GPU-seconds) its attained service has passed, so short jobs
finish in class 0 while long ones sink, and a sunk job that has waited long enough
relative to what it has run is class 0 again (no starvation).
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from dataclasses import replace

from deeppod.scheduler.plan import entitlements
from deeppod.scheduler.pool import FreePool
from deeppod.scheduler.snapshot import (Config, Decisions, PendingJob, Preempt, Resize, RunningJob, Snapshot,
                                        Start, Wait)


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


def service_class(attained: float, thresholds: tuple[float, ...]) -> int:
    """How many attained-service thresholds (GPU-seconds) a job has passed."""
    return sum(attained >= x for x in thresholds)


def waiting_class(job: PendingJob, now: float, cfg: Config) -> int:
    """A queued job's class; back to 0 once it has waited ``starve_factor`` times the
    wall time it has run (and at least ``starve_after``) since it was last queued."""
    c = service_class(job.attained, cfg.las_thresholds)
    if c:
        ran = job.attained / max(1, job.min_workers * job.gpus_per_worker)
        since = job.queued_at if job.queued_at is not None else job.submitted_at
        if now - since >= max(cfg.starve_after, cfg.starve_factor * ran):
            return 0
    return c


def queue_key(job: PendingJob, now: float, cfg: Config, top: int) -> tuple:
    """A tenant's queue order: priority aged up to ``top`` (the highest waiting), service
    class, submit time."""
    aged = min(effective_priority(job, now, cfg.aging_seconds), max(top, job.priority))
    return -aged, waiting_class(job, now, cfg), job.submitted_at, job.id


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
    """Victim order: search trials and idle jobs first, then least work lost, lowest priority,
    most recently started."""
    since = job.last_checkpoint_at if job.last_checkpoint_at is not None else job.started_at
    return (not job.reclaim_first, max(0.0, now - since), job.priority, -job.started_at, job.id)


def schedule(snap: Snapshot) -> Decisions:
    """One round: the phases in the order the module's docstring gives."""
    return _Round(snap).run()


class _Round:
    """The state one round builds up as its phases run. Each phase is a method; the
    bookkeeping they share (evicting a job, shrinking one, earmarking free GPUs for a
    tenant) is written once, in the helpers below them."""

    def __init__(self, snap: Snapshot):
        self.snap, self.cfg, self.now = snap, snap.config, snap.now
        self.out = Decisions()
        self.pool = FreePool(snap.nodes)
        self.healthy = {n.name for n in snap.nodes if n.healthy}
        self.T = _Tenants(snap, {j.tenant for j in snap.queued} | {j.tenant for j in snap.running})
        self.running = list(snap.running)
        self.stopping_gpus = 0.0  # GPUs on their way back: their jobs are stopping
        for job in self.running:
            self.T.add(job.tenant, job.gpus)
            if job.stopping:
                self.stopping_gpus += sum(len(w.gpus) for w in job.placement if w.node in self.healthy)
        self.capacity = self.pool.total_free + sum(len(w.gpus) for j in self.running for w in j.placement
                                                   if w.node in self.healthy)
        self.queues: dict[str, list[PendingJob]] = defaultdict(list)
        for job in snap.queued:
            self.queues[job.tenant].append(job)
        for q in self.queues.values():
            top = max(j.priority for j in q)
            q.sort(key=lambda j: queue_key(j, self.now, self.cfg, top))
        self.ent = entitlements(snap.plan, self._demand(), self.capacity)
        self.gone: set[int] = set()  # on sick nodes or GPUs: preempted by the health phase
        self.victims: dict[str, list[RunningJob]] = defaultdict(list)  # preemptible, by tenant
        self.borrowers: set[int] = set()
        self.planned: dict[int, int] = {}  # job id -> size a shrink in this round asked for
        self.reclaim_for: dict[str, set[int]] = {}  # tenant -> the jobs its earmarked GPUs are for
        self.leaving: set[int] = set()  # jobs evicted in this round
        self.lost_own: set[str] = set()  # tenants that lost a job running within their guarantee this round
        self.claimed_incoming = 0.0  # GPUs already on their way back, spoken for by an earlier reclaim
        self.held_for: dict[str, float] = defaultdict(float)  # free GPUs earmarked for a reclaiming tenant
        self.node_hold: dict[str, tuple[int, tuple]] = {}  # tenant -> (job, GPUs taken from the pool for it)

    def run(self) -> Decisions:
        self.health()
        self.candidates()
        self.reclaim()
        self.fair_share()
        if self.cfg.priority_preemption:
            self.priority()
        if self.cfg.las_preemption and self.cfg.las_thresholds:
            self.least_attained()
        self.starts()
        if self.cfg.grow and self.pool.total_free > 0:
            self.grow()
        return self.out

    def _demand(self) -> dict[str, float]:
        """GPUs each tenant could use: what it runs, what its elastic jobs could grow to, its queue."""
        demand: dict[str, float] = defaultdict(float)
        for job in self.running:
            demand[job.tenant] += job.gpus
            if not job.stopping and job.max_workers > job.workers:
                demand[job.tenant] += (job.max_workers - job.workers) * job.gpus_per_worker
        for t, q in self.queues.items():
            demand[t] += sum((j.resize_to or j.top_workers) * j.gpus_per_worker for j in q)
        return demand

    # the phases -------------------------------------------------------------------
    def health(self) -> None:
        """1. Jobs on unhealthy nodes or GPUs are preempted; they requeue and avoid them."""
        sick = {(n.name, g) for n in self.snap.nodes for g in n.sick_gpus}
        for job in self.running:
            if job.stopping:
                continue
            bad = sorted({w.node for w in job.placement} - self.healthy)
            bad_gpu = sorted((w.node, g) for w in job.placement for g in w.gpus if (w.node, g) in sick)
            if bad:
                why = f"node {bad[0]} is unhealthy; the job is requeued on healthy nodes"
            elif bad_gpu:
                why = f"GPU {bad_gpu[0][1]} of node {bad_gpu[0][0]} is unhealthy; the job is requeued on healthy GPUs"
            else:
                continue
            self.out.preempts.append(Preempt(job.id, why))
            self.gone.add(job.id)

    def candidates(self) -> None:
        """After health: the jobs later phases may shrink or preempt, and which of them borrow."""
        for job in self.running:
            if job.preemptible and not job.stopping and job.id not in self.gone:
                self.victims[job.tenant].append(job)
        self.borrowers = borrowing_jobs(self.running, self.T.g)

    def reclaim(self) -> None:
        """2. Guarantee reclaim, neediest tenant first."""
        T = self.T
        reclaiming = sorted((t for t in self.queues if T.usage[t] < T.g[t]),
                            key=lambda t: (T.usage[t] / max(T.g[t], 1e-9), t))
        for t in reclaiming:
            # Jobs that fit in what is left of the guarantee, in queue order: bigger ones may
            # borrow, not reclaim. If the first cannot be served (no node can be cleared for
            # it), the next size is tried, so one stuck gang does not hold the whole tenant.
            # One job per tenant per round: reclaiming for all of them at once was measured
            # (W45 at 384 GPUs: 2x the preemptions, 9x the GPU-hours lost, the worst tenant
            # 53 h below its guarantee instead of 34 h).
            # Free GPUs are earmarked for as many jobs as fit in the guarantee: that preempts
            # nothing, so it is not the tenant's one reclaim of the round. (One job per round
            # left a tenant short by a GPU per event for minutes: W41 at 256 GPUs.)
            tried: set[tuple[int, int]] = set()
            room = T.g[t] - T.usage[t]
            for head in self.queues[t]:
                need = head.min_workers * head.gpus_per_worker
                shape = (head.min_workers, head.gpus_per_worker)
                if not 0 < need <= room:
                    continue
                if self.cfg.earmark_free and head.gpus_per_worker == 1 and need <= self._avail():
                    self.held_for[t] += need
                    self.reclaim_for.setdefault(t, set()).add(head.id)
                    room -= need
                    continue
                if shape in tried:
                    continue
                tried.add(shape)
                why = (f"reclaim for tenant {t}: it uses {T.usage[t]:g} of its {T.g[t]:g} guaranteed GPUs "
                       f"and job {head.id} waits for {need}")
                if self._take_back(t, head, T.above_guarantee, True, why):
                    self.reclaim_for.setdefault(t, set()).add(head.id)
                    break
                if len(tried) == 1:
                    self.out.waits.append(Wait(head.id, f"tenant {t} is below its guarantee; no jobs can be "
                                                        "preempted to make room for this gang yet"))
                if len(tried) >= 3:
                    break

    def fair_share(self) -> None:
        """3. Fair-share contention: shrink (never preempt) tenants above their share."""
        T = self.T
        for t in sorted(self.queues, key=lambda t: (self._share_used(t), t)):
            head = self.queues[t][0]
            need = head.min_workers * head.gpus_per_worker
            if need == 0 or self.held_for[t] >= need or T.usage[t] + need > self.ent.get(t, 0) + 1e-9:
                continue
            if self._avail() + self.held_for[t] >= need:
                continue
            self._take_back(t, head, lambda v: min(T.usage[v] - self.ent.get(v, 0), T.above_guarantee(v)), False,
                            f"fair share for tenant {t}: job {head.id} waits and it is below its share")

    def priority(self) -> None:
        """4. Within a tenant, a higher-priority head preempts lower-priority jobs."""
        for t, q in self.queues.items():
            head = q[0]
            need = head.min_workers * head.gpus_per_worker
            if need == 0 or self._avail() + self.held_for[t] >= need:
                continue
            lower = sorted((j for j in self.victims.get(t, []) if j.priority < head.priority),
                           key=lambda j: (j.priority, *_loss_key(j, self.now)))
            short, chosen = need - self._avail() - self.held_for[t], []
            for job in lower:
                if short <= 0:
                    break
                chosen.append(job)
                short -= self.planned.get(job.id, job.workers) * job.gpus_per_worker
            if short <= 0:
                for job in chosen:
                    self._evict(job, f"job {head.id} of tenant {t} has higher priority "
                                     f"({head.priority} > {job.priority})")
                self.held_for[t] += min(need, self._avail())

    def least_attained(self) -> None:
        """5. A waiting job of a lower service class takes GPUs from jobs of a higher class
        of its own tenant (with ``las_across_tenants``, also from jobs that borrow, while its
        tenant is within its share and never below the donor's guarantee). Highest class and
        most service first; an elastic victim is shrunk rather than stopped where that is
        enough. Tenants are taken neediest first. Room is made for the tenant's waiting
        jobs of the head's class together (``las_jobs_per_round``); if not all of them can
        have it, for as many as can, the head at least."""
        T, cfg = self.T, self.cfg
        needs = {t: self._las_need(t) for t in self.queues}
        blocked = {t: self._start_rank(t) for t in self.queues
                   if 0 < needs[t] and self._avail() + self.held_for[t] < needs[t]}
        for t in sorted(blocked, key=blocked.get):
            head = self.queues[t][0]
            gpw = head.gpus_per_worker
            need, head_need = needs[t], head.min_workers * gpw
            # workers of several GPUs need whole nodes cleared: they wait for a reservation
            # instead, so that clearing nodes for them does not leave GPUs idle meanwhile
            if gpw != 1:
                continue
            mine = waiting_class(head, self.now, cfg)
            within = T.usage[t] + head_need <= max(T.g[t], self.ent.get(t, 0)) + 1e-9
            cands = [j for v, jobs in self.victims.items() for j in jobs
                     if service_class(j.attained, cfg.las_thresholds) > mine and j.priority <= head.priority
                     and j.gpus and self.now - j.started_at >= cfg.min_run_before_las_preempt
                     and (v == t or (cfg.las_across_tenants and within and j.id in self.borrowers))]
            if not cands:
                continue
            cands.sort(key=lambda j: (-service_class(j.attained, cfg.las_thresholds), -j.attained, j.id))
            have = self._avail() + self.held_for[t]
            budget: dict[str, float] = defaultdict(float)
            plan: list[tuple[RunningJob, int | None]] = []  # (job, new size or None to stop it)
            for job in cands:
                size = self.planned.get(job.id, job.workers)
                if job.tenant != t:
                    room = T.above_guarantee(job.tenant) - budget[job.tenant]
                    if room < job.gpus_per_worker:
                        continue
                else:
                    room = math.inf
                shrinkable = (job.gpus_per_worker == 1 and size > job.min_workers
                              and self.now - job.started_at >= cfg.resize_window(job.in_place))
                if shrinkable:
                    give = min(size - job.min_workers, _slots(room, 1), math.ceil(need - have))
                    plan.append((job, size - give))
                    freed = give
                elif size * job.gpus_per_worker <= room:
                    plan.append((job, None))
                    freed = size * job.gpus_per_worker
                else:
                    continue
                budget[job.tenant] += freed
                have += freed
                if have >= need:
                    break
            if have < head_need:  # not even the head's: take nothing
                continue
            why = f"least attained service: job {head.id} of tenant {t} (class {mine}) waits for {head_need} GPUs"
            if need > head_need:
                why += f", with more jobs of its class behind it ({need} GPUs in all)"
            now_free = min(need, self._avail())
            for job, new in plan:
                ran = f"; this job has run {job.attained / 3600:.1f} GPU-hours"
                if new is None:
                    self._evict(job, why + ran)
                else:
                    self._shrink(job, new, why + ran)
            self.held_for[t] += now_free

    def _las_need(self, t: str) -> int:
        """GPUs for tenant ``t``'s head and the 1-GPU-per-worker jobs right behind it in the
        same priority and class (up to ``las_jobs_per_round`` jobs)."""
        cfg = self.cfg
        head, *rest = self.queues[t][:max(1, cfg.las_jobs_per_round)]
        need = head.min_workers * head.gpus_per_worker
        if head.gpus_per_worker == 1:
            mine = waiting_class(head, self.now, cfg)
            for j in rest:
                if j.gpus_per_worker != 1 or j.priority != head.priority or waiting_class(j, self.now, cfg) != mine:
                    break
                need += j.min_workers
        return need

    def starts(self) -> None:
        """6. Starts, tenant by tenant, neediest first; each tenant's queue in order until
        one of its jobs starts (then the tenants are ranked again)."""
        self.nonlendable = self.T.nonlendable_idle()
        heap = [self._start_rank(t) for t in self.queues]
        heapq.heapify(heap)
        pos = {t: 0 for t in self.queues}
        self.reserved = False
        cpu_only = any(j.gpus_per_worker == 0 for j in self.snap.queued)
        self.failed_need: dict[int, int] = {}  # gpus_per_worker -> smallest gang that did not fit this round
        self.reported = {t for t, q in self.queues.items() if any(w.job_id == q[0].id for w in self.out.waits)}
        while heap:
            t = heapq.heappop(heap)[-1]
            q = self.queues[t]
            while pos[t] < len(q):
                job = q[pos[t]]
                pos[t] += 1
                if self._try_start(t, job):
                    heapq.heappush(heap, self._start_rank(t, pos[t]))
                    break
            if self.pool.total_free <= 0 and not cpu_only and not self.node_hold:
                break
        started = {s.job_id for s in self.out.starts}
        for t, q in self.queues.items():
            if t in self.reported:
                continue
            first = next((j for j in q if j.id not in started), None)
            if first is not None:
                need = first.min_workers * first.gpus_per_worker
                self.out.waits.append(Wait(first.id, f"waiting for {need} GPUs ({max(0, self.pool.total_free)} free)"))

    def grow(self) -> None:
        """7. Grow elastic jobs into GPUs nobody queued can use."""
        T = self.T
        growable = [j for t in self.victims for j in self.victims[t]
                    if j.id not in self.planned and j.max_workers > j.workers and j.gpus_per_worker
                    and self.now - j.started_at >= self.cfg.resize_window(j.in_place)]
        growable.sort(key=lambda j: (self._share_used(j.tenant), j.id))
        for job in growable:
            extra = min(job.max_workers - job.workers, _slots(self._avail(), job.gpus_per_worker),
                        _slots(T.cap_room(job.tenant), job.gpus_per_worker))
            if extra < max(1, job.workers // 4):
                continue
            why = f"grow from {job.workers} to {job.workers + extra} workers into idle GPUs"
            if job.in_place:
                # the running workers stay where they are; the new ones go where GPUs are free
                w0 = job.placement[0]
                added = self.pool.place(extra, job.gpus_per_worker, w0.cpus, w0.memory_mb)
                if added is None:
                    continue
                added = tuple(replace(w, rank=job.workers + i) for i, w in enumerate(added))
                self.out.resizes.append(Resize(job.id, job.workers + extra, why, True, added))
            else:
                trial = self.pool.copy()
                trial.release(job.placement)
                if trial.place(job.workers + extra, job.gpus_per_worker) is None:
                    continue
                self.pool = trial
                self.out.resizes.append(Resize(job.id, job.workers + extra, why))
            T.add(job.tenant, extra * job.gpus_per_worker)

    # starting one job ------------------------------------------------------------------
    def _start_rank(self, t: str, i: int = 0) -> tuple:
        """Tenants below their guarantee first, by the share of their entitlement in use.
        GPUs beyond a guarantee go, with the plan's ``surplus`` ``service``, to the tenant
        whose next job, ``queues[t][i]``, has the lowest service class, then the earliest
        submit time (least attained service across tenants); with ``share``, by the share
        in use, as below."""
        if self.T.usage[t] < self.T.g[t]:
            return 0, self._share_used(t), 0.0, t
        q = self.queues[t]
        if self.snap.plan.surplus == "share":
            return 1, self._share_used(t), 0.0, t
        if i >= len(q):
            return 2, 0, 0.0, t
        return 1, waiting_class(q[i], self.now, self.cfg), q[i].submitted_at, t

    def _try_start(self, t: str, job: PendingJob) -> bool:
        """Place ``job`` if it may start now; otherwise, if it is the first of its tenant
        not to start, say why it waits."""
        T, pool = self.T, self.pool
        hold = self.node_hold.get(t)
        if hold is not None and hold[0] == job.id:
            del self.node_hold[t]
            pool.release(hold[1])
            self.failed_need.clear()  # the pool just grew: what did not fit before may fit now
        gpw = job.gpus_per_worker
        need = job.min_workers * gpw
        is_head = t not in self.reported  # the first job of its tenant that does not start gets the reason
        borrowing = T.usage[t] + need > T.g[t]
        usable = self._free_for(t) - (self.nonlendable if borrowing else 0)
        if t in self.reclaim_for and job.id not in self.reclaim_for[t]:
            usable -= self.held_for[t]  # reclaimed GPUs are for the jobs they were reclaimed for
        if need > T.cap_room(t):
            if is_head:
                self._wait(t, job, f"tenant {t} is at its max ({T.usage[t]:g} GPUs in use); "
                                   "it starts when the tenant's own jobs end")
            return False
        if need > 0 and (need > usable or self.failed_need.get(gpw, 1 << 30) <= job.min_workers):
            if is_head:
                self._wait_for_gpus(t, job, need, usable, borrowing)
            return False
        top = job.resize_to or job.top_workers
        if gpw:
            fair_room = _slots(self.ent.get(t, 0) - T.usage[t], gpw)
            top = max(job.min_workers, min(top, fair_room, _slots(T.cap_room(t), gpw), _slots(usable, gpw)))
        placement = pool.place(top, gpw, job.cpus_per_worker, job.memory_mb_per_worker, job.avoid)
        if placement is None and top != job.min_workers:
            placement = pool.place(job.min_workers, gpw, job.cpus_per_worker, job.memory_mb_per_worker, job.avoid)
        if placement is None:
            self.failed_need[gpw] = min(self.failed_need.get(gpw, 1 << 30), job.min_workers)
            if is_head:
                self._wait(t, job, pool.shortage(job.min_workers, gpw, job.cpus_per_worker, job.memory_mb_per_worker))
            return False
        gpus = len(placement) * gpw
        self.held_for[t] = max(0.0, self.held_for[t] - gpus)
        T.add(t, gpus)
        borrowed = max(0.0, T.usage[t] - T.g[t])
        mine = set(T.chain(t))
        lender = any(g > 0 for name, g in T.g.items() if name not in mine)  # someone it could borrow from
        self.out.starts.append(Start(job.id, placement, "within guarantee" if borrowed == 0 else
                                     f"borrowing {borrowed:g} idle GPUs" if lender else
                                     "on free GPUs (no plan guarantees them to another tenant)"))
        return True

    def _wait(self, t: str, job: PendingJob, why: str) -> None:
        self.reported.add(t)
        self.out.waits.append(Wait(job.id, why))

    def _wait_for_gpus(self, t: str, job: PendingJob, need: int, usable: float, borrowing: bool) -> None:
        """Not enough GPUs: the first big job that has waited long enough, and that its tenant
        deserves, gets a reservation of whole nodes while smaller jobs backfill elsewhere."""
        reachable = self.capacity - (self.nonlendable if borrowing else 0)
        deserved = max(self.T.g[t], self.ent.get(t, 0)) - self.T.usage[t]
        if (not self.reserved and job.gpus_per_worker and self.now - job.submitted_at >= self.cfg.reserve_after_seconds
                and need <= reachable and need <= deserved + 1e-9):
            held = _reserve(self.pool, self.snap, need, limit=int(self._avail()))
            self.reserved = True
            self._wait(t, job, f"waiting for {need} GPUs; {held} free GPUs are reserved "
                               "for it and smaller jobs backfill elsewhere")
        else:
            self._wait(t, job, f"waiting for {need} GPUs ({max(0, int(usable))} free)")

    # making room ----------------------------------------------------------------------
    def _take_back(self, t: str, head: PendingJob, floor_of, allow_preempt: bool, why: str) -> bool:
        """Make room for ``head`` of tenant ``t``: free GPUs, GPUs already on their way
        back, then elastic shrinks, then (if allowed) whole-job preemptions. ``floor_of(v)``
        is how many GPUs donor ``v`` may give up."""
        need = head.min_workers * head.gpus_per_worker
        if head.gpus_per_worker > 1:
            return allow_preempt and self._take_back_nodes(t, head, floor_of, why)
        now_free = min(need, self._avail())
        short = need - now_free
        incoming = max(0.0, self.stopping_gpus - self.claimed_incoming)
        if short > incoming:
            deficit = short - incoming
            donors = [v for v in self.victims if v != t and
                      (floor_of(v) > 0 or (allow_preempt and any(j.id in self.borrowers for j in self.victims[v])))]
            budget = {v: floor_of(v) for v in donors}
            resize, gained = self._plan_shrinks(donors, budget, deficit, allow_preempt)
            evict: list[RunningJob] = []
            if allow_preempt:
                evict, gained = self._plan_evictions(donors, budget, resize, deficit, gained)
            if gained < deficit:
                return False
            for job in evict:
                self._evict(job, why)
            for job in self.running:
                if job.id in resize:
                    self._shrink(job, resize[job.id], why)
            self.stopping_gpus += gained  # on their way back now; what this tenant does not need, the next may use
        self.claimed_incoming += short
        self.held_for[t] += now_free
        return True

    def _plan_shrinks(self, donors: list[str], budget: dict[str, float], deficit: float,
                      any_age: bool) -> tuple[dict[int, int], float]:
        """Elastic jobs of the donors shrunk toward their minimum, least work lost first,
        within each donor's budget: {job id: new size} and the GPUs that frees."""
        shrinks = [job for v in donors for job in self.victims[v]
                   if job.max_workers > job.min_workers and self.planned.get(job.id, job.workers) > job.min_workers
                   and job.gpus_per_worker
                   and (any_age or self.now - job.started_at >= self.cfg.resize_window(job.in_place))]
        shrinks.sort(key=lambda j: _loss_key(j, self.now))
        resize: dict[int, int] = {}
        gained = 0.0
        for job in shrinks:
            if gained >= deficit:
                break
            gpw, size = job.gpus_per_worker, self.planned.get(job.id, job.workers)
            spare = min(size - job.min_workers, _slots(budget[job.tenant], gpw), math.ceil((deficit - gained) / gpw))
            if spare > 0:
                resize[job.id] = size - spare
                budget[job.tenant] -= spare * gpw
                gained += spare * gpw
        return resize, gained

    def _plan_evictions(self, donors: list[str], budget: dict[str, float], resize: dict[int, int],
                        deficit: float, gained: float) -> tuple[list[RunningJob], float]:
        """Whole jobs to preempt, least work lost first: first those whose loss leaves their
        tenant at or above its guarantee; only then borrowing jobs that take it below (it
        would come back asking for its own). A planned shrink of an evicted job is dropped.
        If that order falls short (a small job taken first can leave a donor's budget too
        small for the borrowing job that would have covered it), borrowing jobs are tried
        first, biggest first, in one pass. Returns the jobs and ``gained`` plus what they free; ``budget``
        and ``resize`` are updated for the plan that covers the deficit."""
        victims = [job for v in donors for job in self.victims[v] if job.gpus]
        plans = ((sorted(victims, key=lambda j: _loss_key(j, self.now)), (False, True)),
                 (sorted(victims, key=lambda j: (j.id not in self.borrowers, -j.gpus, _loss_key(j, self.now))),
                  (None,)))
        first = None
        for order, passes in plans:
            b, r = dict(budget), dict(resize)
            evict, got = self._evict_in_order(order, passes, b, r, deficit, gained)
            if got >= deficit:
                budget.update(b)
                resize.clear()
                resize.update(r)
                return evict, got
            first = first or (evict, got)
        return first

    def _evict_in_order(self, preempts: list[RunningJob], passes: tuple, budget: dict[str, float],
                        resize: dict[int, int], deficit: float, gained: float) -> tuple[list[RunningJob], float]:
        """One plan: ``passes`` (False, True) takes the jobs that leave their tenant at or
        above its guarantee before those that cross it; (None,) takes both in one pass."""
        evict: list[RunningJob] = []
        own = set(self.lost_own)
        for crossing in passes:
            for job in preempts:
                if gained >= deficit:
                    break
                if job in evict:
                    continue
                rest = resize.get(job.id, self.planned.get(job.id, job.workers)) * job.gpus_per_worker
                crosses = rest > budget[job.tenant]
                if crossing is not None and crosses != crossing:
                    continue
                if crosses and (job.id not in self.borrowers or job.tenant in own):
                    continue  # it runs within its tenant's guarantee, or the tenant gave one up already
                if job.id not in self.borrowers:
                    own.add(job.tenant)
                resize.pop(job.id, None)
                evict.append(job)
                budget[job.tenant] -= rest
                gained += rest
        return evict, gained

    def _take_back_nodes(self, t: str, head: PendingJob, floor_of, why: str) -> bool:
        """Reclaim for workers of several GPUs each, which need that many free on one node:
        clear the nodes that cost least (fewest jobs, least progress lost), counting GPUs
        already on their way back as free, never taking a donor below its floor. If no
        node can be cleared that way, jobs may be moved off (``_move_for``)."""
        pool, gpw = self.pool, head.gpus_per_worker
        free_on = [len(f) for f in pool.free]
        on_node: dict[int, list[RunningJob]] = defaultdict(list)
        for job in self.running:
            for w in job.placement:
                i = pool.index.get(w.node)
                if i is None:
                    continue
                if job.stopping or job.id in self.leaving:
                    free_on[i] += len(w.gpus)
                elif (job.preemptible and job.id not in self.gone and job.tenant != t
                      and job in self.victims[job.tenant] and job not in on_node[i]):
                    on_node[i].append(job)
        whole = [i for i, f in enumerate(free_on) if f >= gpw and pool.names[i] in self.healthy]
        missing = head.min_workers - sum(free_on[i] // gpw for i in whole)
        if missing <= 0:
            if sum(len(pool.free[i]) // gpw for i in range(len(pool.names))) >= head.min_workers:
                self._hold_for(t, head)  # it can start now: keep them for it
            elif self.cfg.defragment:  # whole once their jobs have stopped: the fullest first
                whole.sort(key=lambda i: (-free_on[i], i))
                enough = next(k for k in range(1, len(whole) + 1)
                              if sum(free_on[i] // gpw for i in whole[:k]) >= head.min_workers)
                self._keep_clear(whole[:enough])
            return True
        start = (list(free_on), list(whole), missing)  # for _move_for, before this plan's evictions
        budget = {v: floor_of(v) for v in self.victims if v != t}
        chosen: list[RunningJob] = []
        cleared: list[int] = []
        for _ in range(missing):
            best = None
            for i, jobs in on_node.items():
                picked = self._clear_node(i, jobs, gpw - free_on[i] % gpw, chosen, budget)
                if picked is not None:
                    cost = (len(picked), sum(j.gpus for j in picked), [_loss_key(j, self.now) for j in picked])
                    if best is None or cost < best[0]:
                        best = (cost, picked, i)
            if best is None:
                return self.cfg.defragment and self._move_for(t, head, *start, floor_of, why)
            cleared.append(best[2])
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
            self._evict(job, why)
        # nothing earmarked: the GPUs it needs are on the nodes being cleared, not the free ones
        if self.cfg.defragment:
            self._keep_clear(whole + cleared)
        return True

    def _hold_for(self, t: str, head: PendingJob) -> None:
        """Take the GPUs ``head`` will start on out of the pool for this round: a count
        earmarked for it would not stop a whole node from going to another tenant's job."""
        placement = self.pool.place(head.min_workers, head.gpus_per_worker, head.cpus_per_worker,
                                    head.memory_mb_per_worker, head.avoid) if self.cfg.defragment else None
        if placement is None:  # defragment off, or CPUs or memory are short: a count
            self.held_for[t] += min(head.min_workers * head.gpus_per_worker, self._avail())
        else:
            self.node_hold[t] = (head.id, placement)

    def _keep_clear(self, nodes: list[int]) -> None:
        """Nodes that become whole once their stopping jobs are gone: nothing else may start
        on their free GPUs meanwhile (the fullest-node-first placement would pick them)."""
        for i in set(nodes):
            if self.pool.free[i]:
                self.pool.take(i, list(self.pool.free[i]), 0, 0)

    def _move_for(self, t: str, head: PendingJob, free_on: list[int], whole: list[int], missing: int,
                  floor_of, why: str) -> bool:
        """No node can be cleared for ``head``'s gang by evicting jobs that borrow: clear the
        cheapest nodes (fewest GPUs in use) by evicting what borrows there, within the
        donors' budgets, and moving the other jobs onto free GPUs of other nodes (evicting
        more borrowing jobs elsewhere if that is what makes room for them). A moved job is
        checkpointed and requeued and starts again on that room in the next round, so its
        tenant keeps its share; the cleared nodes are kept clear until the gang starts."""
        pool, gpw, cfg = self.pool, head.gpus_per_worker, self.cfg
        since = head.queued_at if head.queued_at is not None else head.submitted_at
        if self.now - since < cfg.reserve_after_seconds:
            return False  # a gang that has just arrived waits for nodes to drain by themselves first
        on_node: dict[int, list[RunningJob]] = defaultdict(list)
        for job in self.running:
            if not (job.stopping or job.id in self.leaving or job.id in self.gone):
                for i in {pool.index[w.node] for w in job.placement if w.node in pool.index}:
                    on_node[i].append(job)
        trial = pool.copy()
        for i in whole:
            trial.take(i, list(trial.free[i]), 0, 0)
        plan = _Clearing(self, t, trial, set(whole), {v: floor_of(v) for v in self.victims if v != t})
        order = sorted((gpw - free_on[i] % gpw, i) for i in on_node
                       if i not in plan.targets and pool.names[i] in self.healthy)
        cleared: list[int] = []
        for _, i in order:
            if len(cleared) >= missing:
                break
            if plan.clear(i, on_node[i]):
                cleared.append(i)
        if len(cleared) < missing or plan.pool.total_free < sum(self.held_for.values()):
            return False
        for job in plan.evicted:
            self._evict(job, why)
        for job in plan.moved:
            self._stop(job, f"moved to free GPUs on other nodes: {why}; whole nodes are cleared for it")
        self._keep_clear(whole + cleared)
        return True

    def _clear_node(self, i: int, jobs: list[RunningJob], want: int, chosen: list[RunningJob],
                    budget: dict[str, float]) -> list[RunningJob] | None:
        """The jobs on node ``i`` whose eviction frees ``want`` GPUs there, least loss first,
        within the donors' budgets; None if that cannot be done."""
        picked, freed, spent = [], 0, defaultdict(float)
        own_here = {j.tenant for j in chosen if j.id not in self.borrowers}
        for job in sorted(jobs, key=lambda j: _loss_key(j, self.now)):
            if freed >= want or job in chosen:
                continue
            within = job.gpus + spent[job.tenant] <= budget.get(job.tenant, 0)
            if job.id not in self.borrowers and not within:
                continue  # it runs within its tenant's guarantee
            if not within and (job.tenant in self.lost_own or job.tenant in own_here):
                continue  # the tenant gives up a job of its own here: nothing past its guarantee
            if job.id not in self.borrowers:
                own_here.add(job.tenant)
            picked.append(job)
            spent[job.tenant] += job.gpus
            freed += sum(len(w.gpus) for w in job.placement if w.node == self.pool.names[i])
        return picked if freed >= want else None

    # shared bookkeeping -------------------------------------------------------------------
    def _evict(self, job: RunningJob, why: str) -> None:
        """Preempt ``job``: its GPUs leave its tenant's usage (a shrink planned for it is dropped)."""
        self._stop(job, why)
        if job.id not in self.borrowers:
            self.lost_own.add(job.tenant)
        self.T.add(job.tenant, -self.planned.pop(job.id, job.workers) * job.gpus_per_worker)

    def _stop(self, job: RunningJob, why: str) -> None:
        """Preempt ``job``, its GPUs left in its tenant's usage: alone, that is a move (they
        come back to it on other nodes); ``_evict`` also takes them off."""
        self.out.preempts.append(Preempt(job.id, why))
        self._drop_resize(job.id)
        self.leaving.add(job.id)
        self.victims[job.tenant].remove(job)

    def _shrink(self, job: RunningJob, new: int, why: str) -> None:
        size = self.planned.get(job.id, job.workers)
        self._drop_resize(job.id)
        self.out.resizes.append(Resize(job.id, new, f"shrink from {job.workers} to {new} workers: {why}",
                                       job.in_place))
        self.planned[job.id] = new  # it stays a candidate: a later reclaim may shrink or evict it
        self.T.add(job.tenant, -(size - new) * job.gpus_per_worker)

    def _drop_resize(self, job_id: int) -> None:
        self.out.resizes[:] = [r for r in self.out.resizes if r.job_id != job_id]

    def _share_used(self, t: str) -> float:
        """How much of its entitlement tenant ``t`` uses."""
        return self.T.usage[t] / max(self.ent.get(t, 0), 1e-9)

    def _free_for(self, t: str) -> float:
        """Free GPUs tenant ``t`` may use: all but those earmarked for other tenants."""
        return self.pool.total_free - sum(v for k, v in self.held_for.items() if k != t)

    def _avail(self) -> float:
        """Free GPUs nobody has earmarked."""
        return max(0.0, self.pool.total_free - sum(self.held_for.values()))


class _Clearing:
    """A plan, built node by node, that clears nodes for a gang by evicting jobs that borrow
    and moving the others elsewhere (``_Round._move_for``). ``pool`` is the free GPUs once
    the plan has run: GPUs of planned jobs off the nodes being cleared come back to it, and
    moved jobs take theirs from it."""

    def __init__(self, rnd: "_Round", tenant: str, pool: FreePool, targets: set[int], budget: dict[str, float]):
        self.r, self.tenant, self.pool, self.targets, self.budget = rnd, tenant, pool, targets, budget
        self.evicted: list[RunningJob] = []
        self.moved: list[RunningJob] = []
        self.landed: set[int] = set()  # nodes moved jobs are planned onto: they cannot be cleared
        self.stoppable = {id(j) for js in rnd.victims.values() for j in js}  # preemptible, not stopping

    def clear(self, i: int, jobs: list[RunningJob]) -> bool:
        """Add node ``i`` to the plan if everything on it can be evicted or moved."""
        if i in self.landed:
            return False
        r, pool, budget = self.r, self.pool.copy(), dict(self.budget)
        targets = self.targets | {i}
        pool.take(i, list(pool.free[i]), 0, 0)
        evicted, moved = [], []
        planned = set(map(id, self.evicted + self.moved))

        def release(job: RunningJob) -> None:
            for w in job.placement:
                k = pool.index.get(w.node)
                if k is not None and k not in targets and w.node in r.healthy:
                    pool.give(w.node, w.gpus, w.cpus, w.memory_mb)

        def may_evict(job: RunningJob) -> bool:
            return (job.tenant != self.tenant and job.id in r.borrowers and job.gpus <= budget.get(job.tenant, 0)
                    and id(job) in self.stoppable)

        for job in sorted(jobs, key=lambda j: _loss_key(j, r.now)):
            if id(job) in planned:
                continue
            if may_evict(job):
                evicted.append(job)
                budget[job.tenant] -= job.gpus
            elif (job.gpus and id(job) in self.stoppable
                  and r.now - job.started_at >= r.cfg.min_run_before_las_preempt):
                moved.append(job)
            else:
                return False  # it may not be stopped (or ran too briefly to be moved)
            release(job)
        spare = None  # borrowing jobs elsewhere, least loss first: built only if a moved job needs room
        landed = set()
        for job in moved:
            w0 = job.placement[0]
            while (got := pool.place(job.workers, job.gpus_per_worker, w0.cpus, w0.memory_mb)) is None:
                if spare is None:
                    here = planned | set(map(id, jobs))
                    spare = sorted((j for js in r.victims.values() for j in js
                                    if id(j) not in here and j.id in r.borrowers), key=lambda j: _loss_key(j, r.now))
                taken = set(map(id, evicted))
                extra = next((j for j in spare if id(j) not in taken and may_evict(j)), None)
                if extra is None:
                    return False
                evicted.append(extra)
                budget[extra.tenant] -= extra.gpus
                release(extra)
            landed |= {pool.index[w.node] for w in got}
        self.pool, self.budget, self.targets = pool, budget, targets
        self.evicted += evicted
        self.moved += moved
        self.landed |= landed
        return True


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
