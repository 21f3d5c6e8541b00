"""What one scheduling round knows and builds up as its phases run (policy.py) and as they
make room for waiting jobs (preempt.py): one explicit value, ``RoundState``, with the
bookkeeping every phase shares written once (evict, stop, shrink, what is free)."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from operator import attrgetter

from deeppod.scheduler.plan import entitlements, flat_plan
from deeppod.scheduler.pool import FreePool
from deeppod.scheduler.queue_order import queue_gpus, queue_key, waiting_class
from deeppod.scheduler.round_cache import Derived, RoundCache
from deeppod.scheduler.snapshot import Config, Decisions, PendingJob, Preempt, Resize, RunningJob, Snapshot

_tenant = attrgetter("tenant")


def plan_tables(plan) -> tuple:
    """Each plan node's parent, guarantee, max and lend limit, parents first; and
    ``plan.flat_plan``'s view of it, for the entitlements."""
    parent: dict[str, str | None] = {}
    guaranteed: dict[str, float] = {}
    most: dict[str, float] = {}
    lend: dict[str, float | None] = {}
    for node, up, _ in plan.walk():
        parent[node.name] = up
        guaranteed[node.name] = node.guaranteed
        most[node.name] = math.inf if node.max is None else node.max
        lend[node.name] = node.lend_limit
    return parent, guaranteed, most, lend, flat_plan(plan)


class TenantUsage:
    """Per-tenant accounting along the plan tree (usage counts against every ancestor)."""

    def __init__(self, snap: Snapshot, tenants: set[str], tables: tuple | None = None):
        """``tables``: ``plan_tables(snap.plan)``, if the caller kept them."""
        self.parent, self.guaranteed, self.max, self.lend = (dict(d) for d in (tables or plan_tables(snap.plan))[:4])
        for t in tenants:
            if t not in self.parent:
                self.parent[t], self.guaranteed[t], self.max[t], self.lend[t] = None, 0, math.inf, None
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
        return min(self.usage[a] - self.guaranteed[a] for a in self.chain(t))

    def nonlendable_idle(self) -> float:
        total = 0.0
        for t, limit in self.lend.items():
            if limit is not None:
                idle = self.guaranteed[t] - self.usage[t]
                total += max(0.0, idle - limit)
        return total


class HeldFor(defaultdict):
    """Free GPUs earmarked per tenant (0 for one not named), with their total kept as they
    change: a start asks what is free for its tenant (all but the others' earmarks) once per
    job tried, thousands of times a round at 10,000 queued jobs. The counts are whole GPUs, so
    the running total is exact."""

    def __init__(self):
        super().__init__(float)
        self.total = 0.0

    def __setitem__(self, t: str, gpus: float) -> None:
        self.total += gpus - self.get(t, 0.0)
        super().__setitem__(t, gpus)


def slots(gpus: float, per: int) -> int:
    """Whole workers of ``per`` GPUs that fit in ``gpus`` (which may be infinite)."""
    return 1 << 30 if math.isinf(gpus) else int(gpus // per)


def loss_key(job: RunningJob, now: float):
    """Victim order: search trials and idle jobs first, then least work lost, lowest priority,
    most recently started."""
    since = job.last_checkpoint_at if job.last_checkpoint_at is not None else job.started_at
    return (not job.reclaim_first, max(0.0, now - since), job.priority, -job.started_at, job.id)


def borrowing_jobs(running: list[RunningJob], guaranteed: dict[str, float]) -> set[int]:
    """Jobs that run only by borrowing: in start order, a tenant's jobs up to its guarantee
    are its own; the one that crosses it, and those after, borrow (Kueue's semantics)."""
    used: dict[str, float] = defaultdict(float)
    out = set()
    for job in sorted(running, key=attrgetter("started_at", "id")):
        used[job.tenant] += job.gpus
        if used[job.tenant] > guaranteed.get(job.tenant, 0):
            out.add(job.id)
    return out


@dataclass
class RoundState:
    """Read-only for the round: ``snap``, ``cfg``, ``now``, ``healthy``, ``capacity``,
    ``entitled``. The rest changes as the phases decide, through the methods below."""

    snap: Snapshot
    cfg: Config
    now: float
    out: Decisions  # what the round decided so far
    pool: FreePool  # free GPUs, CPUs and memory per node, as the decisions so far leave them
    healthy: set[str]  # names of healthy nodes
    tenants: TenantUsage  # GPUs each tenant (and plan ancestor) uses, as the decisions so far leave it
    running: list[RunningJob]
    queues: dict[str, list[PendingJob]]  # per tenant, in queue order (queue_key)
    capacity: float  # healthy GPUs, free or held
    entitled: dict[str, float] = field(default_factory=dict)  # each tenant's weighted fair share of the capacity
    stopping_gpus: float = 0.0  # GPUs on their way back: their jobs are stopping
    gone: set[int] = field(default_factory=set)  # on sick nodes or GPUs: preempted by the health phase
    victims: dict[str, list[RunningJob]] = field(default_factory=lambda: defaultdict(list))  # preemptible, by tenant
    borrowers: set[int] = field(default_factory=set)  # jobs that run only by borrowing
    planned: dict[int, int] = field(default_factory=dict)  # job id -> size a shrink in this round asked for
    reclaim_for: dict[str, set[int]] = field(default_factory=dict)  # tenant -> the jobs its earmarked GPUs are for
    leaving: set[int] = field(default_factory=set)  # jobs evicted in this round
    lost_own: set[str] = field(default_factory=set)  # tenants that lost a job running within their guarantee
    claimed_incoming: float = 0.0  # GPUs already on their way back, spoken for by an earlier reclaim
    held_for: HeldFor = field(default_factory=HeldFor)  # free GPUs earmarked per tenant
    node_hold: dict[str, tuple[int, tuple]] = field(default_factory=dict)  # tenant -> (job, GPUs taken for it)
    # the starts phase's
    nonlendable: float = 0.0  # idle guaranteed GPUs their tenants do not lend
    reserved: bool = False  # a big job got a reservation of whole nodes this round
    # (GPUs per worker, GPU MiB each) -> the smallest gang of that shape that did not fit
    failed_need: dict[tuple[int, int], int] = field(default_factory=dict)
    reported: set[str] = field(default_factory=set)  # tenants whose first waiting job was told why
    victim_ids: set[int] = field(default_factory=set)  # id() of the jobs in ``victims``
    left: list[RunningJob] = field(default_factory=list)  # the jobs of ``leaving``
    derived: Derived | None = None  # what a RoundCache kept from the last round, brought up to date
    _spans: list | None = None  # built once a round, when first asked for
    _stopping: list | None = None
    _may_shrink: bool | None = None
    _own_victims: set[str] = field(default_factory=set)  # tenants whose victims list this round copied
    _borrowing_victims: list[RunningJob] | None = None
    cache: RoundCache | None = None
    cpu_only: bool = False  # a waiting job asks for no GPU

    @classmethod
    def of(cls, snap: Snapshot, cache: RoundCache | None = None) -> RoundState:
        running = list(snap.running)
        derived = None
        if cache is not None:
            pool, healthy, sick = cache.pool(snap.nodes)
            tables = cache.plan_tables(snap.plan, plan_tables)
            # the plan's guarantees: a tenant it does not name has none (TenantUsage gives it 0)
            derived = cache.derive(snap, healthy, tables[1], sick)
            used, wants, busy, stopping = derived.used, derived.wants, derived.busy, derived.stopping
            queues, asks, cpu_only = cache.queues(snap)
            tenants = TenantUsage(snap, set(queues) | used.keys(), tables)
        else:
            pool, healthy = FreePool(snap.nodes), {n.name for n in snap.nodes if n.healthy}
            tenants = TenantUsage(snap, set(map(_tenant, snap.queued)) | set(map(_tenant, snap.running)))
            # one walk of the running jobs (thousands, every round): per tenant first, then the
            # plan's chain once per tenant; whole GPUs, so the sums are exact in any order
            stopping, busy = 0, 0
            used: dict[str, int] = defaultdict(int)
            wants: dict[str, int] = defaultdict(int)  # GPUs elastic jobs could grow by
            for job in running:
                per, placement = job.gpus_per_worker, job.placement
                used[job.tenant] += len(placement) * per
                on_healthy = sum(len(w.gpus) for w in placement if w.node in healthy)
                busy += on_healthy
                if job.stopping:
                    stopping += on_healthy
                elif job.max_workers > len(placement):
                    wants[job.tenant] += (job.max_workers - len(placement)) * per
            queues = defaultdict(list)
            for job in snap.queued:
                queues[job.tenant].append(job)
            for t, q in queues.items():
                top = max(j.priority for j in q)
                q.sort(key=lambda j: queue_key(j, snap.now, snap.config, top))
            queues, cpu_only = dict(queues), any(j.gpus_per_worker == 0 for j in snap.queued)
            asks = {t: queue_gpus(q) for t, q in queues.items()}
        for t, gpus in used.items():
            tenants.add(t, gpus)
        capacity = pool.total_free + busy
        st = cls(snap=snap, cfg=snap.config, now=snap.now, out=Decisions(), pool=pool, healthy=healthy,
                 tenants=tenants, running=running, queues=queues, capacity=capacity, stopping_gpus=float(stopping),
                 derived=derived, cache=cache, cpu_only=cpu_only)
        st.entitled = entitlements(snap.plan, st.demand(used, wants, asks), capacity,
                                   tables[4] if cache is not None else None)
        return st

    def demand(self, used: dict[str, int], wants: dict[str, int], asks: dict[str, int]) -> dict[str, float]:
        """GPUs each tenant could use: what it runs (``used``), what its elastic jobs could
        grow by (``wants``), what its queue asks for (``asks``: queue_order.queue_gpus)."""
        demand: dict[str, float] = defaultdict(float)
        for t in used:
            demand[t] += used[t] + wants.get(t, 0)
        for t in self.queues:
            demand[t] += asks[t]
        return demand

    # what the round cache kept, where there is one: each answers as a walk would without it
    def queue_memo(self, t: str) -> dict | None:
        """What the round keeps of tenant ``t``'s queue; None without the round cache."""
        return self.cache.queue_memo(t, self.queues[t]) if self.cache is not None else None

    def least_needs(self, t: str) -> list[int] | None:
        """Per queue position, the fewest GPUs a job from there on starts with; None without a cache."""
        return self.cache.least_needs(t, self.queues[t]) if self.cache is not None else None

    def has_lower_victim(self, t: str, priority: int) -> bool:
        """Whether a job of tenant ``t`` that may be stopped runs at a priority below ``priority``."""
        victims = self.victims.get(t, ())
        if self.cache is not None:
            return self.cache.lowest_priority(t, victims) < priority
        return any(j.priority < priority for j in victims)

    def las_ready_at(self, t: str, bar: float, priority: int) -> float:
        """No job of tenant ``t``'s own can be taken by least attained service for a head of
        ``priority`` below class ``bar`` before this time (RoundCache.las_ready_at); -inf
        without the round cache (then each round looks)."""
        if self.cache is None:
            return -math.inf
        return self.cache.las_ready_at(t, self.victims.get(t, ()), bar, priority, self.cfg.min_run_before_las_preempt)

    def waiting_class(self, job: PendingJob) -> int:
        """``queue_order.waiting_class`` of a queued job at this round's time: read from the
        queue key the round cache kept for it, if there is one."""
        if self.cache is not None:
            kept = self.cache.waiting_class(job)
            if kept is not None:
                return kept
        return waiting_class(job, self.now, self.cfg)

    def borrowing_victims(self) -> list[RunningJob]:
        """The jobs that may be stopped and run by borrowing, as of the first time a round asks
        (a job stopped since is no longer in ``victim_ids``: check it there)."""
        if self._borrowing_victims is None:
            self._borrowing_victims = [j for js in self.victims.values() for j in js if j.id in self.borrowers]
        return self._borrowing_victims

    def may_shrink(self) -> bool:
        """Whether any job that may be stopped could also be shrunk (it runs above its minimum
        size). Asked once a round: the jobs that may be stopped only get fewer as it goes, so
        a no stays a no (a yes is checked again job by job by whoever shrinks)."""
        if self._may_shrink is None and self.derived is not None:
            self._may_shrink = self.derived.may_shrink
        if self._may_shrink is None:
            self._may_shrink = any(j.max_workers > j.min_workers for js in self.victims.values() for j in js)
        return self._may_shrink

    def spans(self) -> list[tuple[RunningJob, tuple[tuple[int, int], ...]]]:
        """Each running job, in order, with :meth:`span`. Built once a round, when a gang's
        reclaim first needs nodes cleared (it may try a gang per tenant: 12 walks of 5,500
        jobs at 10,000 GPUs otherwise)."""
        if self._spans is None:
            self._spans = [(job, self.span(job)) for job in self.running]
        return self._spans

    def span(self, job: RunningJob) -> tuple[tuple[int, int], ...]:
        """(pool index, GPUs there) for each of ``job``'s workers on a node the pool knows."""
        index = self.pool.index
        return tuple((index[w.node], len(w.gpus)) for w in job.placement if w.node in index)

    def coming_back(self) -> list[tuple[tuple[int, int], ...]]:
        """The spans of the jobs whose GPUs are on their way back (stopping, or preempted in
        this round), without a walk of every running job."""
        if self._stopping is None:
            stopping = self.derived.stopping_jobs if self.derived is not None else self.running
            self._stopping = [self.span(job) for job in stopping if job.stopping]
        return self._stopping + [self.span(job) for job in self.left if not job.stopping]

    # the bookkeeping every phase shares -------------------------------------------------
    def evict(self, job: RunningJob, why: str) -> None:
        """Preempt ``job``: its GPUs leave its tenant's usage (a shrink planned for it is dropped)."""
        self.stop(job, why)
        if job.id not in self.borrowers:
            self.lost_own.add(job.tenant)
        self.tenants.add(job.tenant, -self.planned.pop(job.id, job.workers) * job.gpus_per_worker)

    def stop(self, job: RunningJob, why: str) -> None:
        """Preempt ``job``, its GPUs left in its tenant's usage: alone, that is a move (they
        come back to it on other nodes); ``evict`` also takes them off."""
        self.out.preempts.append(Preempt(job.id, why))
        self.drop_resize(job.id)
        if job.id not in self.leaving:
            self.leaving.add(job.id)
            self.left.append(job)
        if self.derived is not None and job.tenant not in self._own_victims:  # the cache's list: copy it first
            self.victims[job.tenant] = list(self.victims[job.tenant])
            self._own_victims.add(job.tenant)
        self.victims[job.tenant].remove(job)
        if self.derived is not None and self.victim_ids is self.derived.victim_ids:  # the cache's set: copy it first
            self.victim_ids = set(self.victim_ids)
        self.victim_ids.discard(id(job))

    def shrink(self, job: RunningJob, new: int, why: str) -> None:
        size = self.planned.get(job.id, job.workers)
        self.drop_resize(job.id)
        self.out.resizes.append(Resize(job.id, new, f"shrink from {job.workers} to {new} workers: {why}",
                                       job.in_place))
        self.planned[job.id] = new  # it stays a candidate: a later reclaim may shrink or evict it
        self.tenants.add(job.tenant, -(size - new) * job.gpus_per_worker)

    def drop_resize(self, job_id: int) -> None:
        self.out.resizes[:] = [r for r in self.out.resizes if r.job_id != job_id]

    def share_used(self, t: str) -> float:
        """How much of its entitlement tenant ``t`` uses."""
        return self.tenants.usage[t] / max(self.entitled.get(t, 0), 1e-9)

    def free_for(self, t: str) -> float:
        """Free GPUs tenant ``t`` may use: all but those earmarked for other tenants."""
        return self.pool.total_free - (self.held_for.total - self.held_for.get(t, 0.0))

    def avail(self) -> float:
        """Free GPUs nobody has earmarked."""
        return max(0.0, self.pool.total_free - self.held_for.total)

    def avail_for(self, job: PendingJob) -> float:
        """``avail()``, but no more than the free GPUs that have the memory ``job`` asks of each."""
        gmem = job.gpu_memory_mb
        return min(self.avail(), self.pool.free_with(gmem)) if gmem else self.avail()
