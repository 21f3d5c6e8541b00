"""What a round derives from the running jobs, kept from one round to the next.

Most rounds change little: a job or two arrived, started or ended. A round on its own walks
every running job several times (each tenant's GPUs, what is on its way back, which jobs
may be stopped, which of them borrow, which sit on a sick node); at 10,000 GPUs that is
most of a replay's time. ``RoundCache`` keeps those results and brings them up to date
from the jobs that came and went since the last round (by identity: a job whose row
changed is a new object, so it left and came back), and rebuilds them from scratch when
what they rest on changed (a node's health, the plan) or when a node or GPU is sick.

The policy stays pure: ``schedule(snap, cache)`` decides exactly what ``schedule(snap)``
does (tests/scheduler/test_round_cache.py replays rounds both ways). A caller that builds
every row afresh each round (the control plane reads them from the database) gains nothing
from it; the simulator keeps its rows and passes one.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from dataclasses import dataclass
from itertools import compress, filterfalse
from operator import attrgetter, is_not

from deeppod.scheduler.pool import FreePool, fresh_bucket
from deeppod.scheduler.queue_order import queue_gpus, queue_key, queue_key_until
from deeppod.scheduler.snapshot import Config, NodeState, PendingJob, RunningJob, Snapshot

_tenant = attrgetter("tenant")


@dataclass
class Derived:
    """A round's starting point from the running jobs (the round copies what it changes)."""

    used: dict[str, int]  # GPUs each tenant runs on
    wants: dict[str, int]  # GPUs each tenant's elastic jobs could grow by
    busy: int  # GPUs in use on healthy nodes
    stopping: int  # of those, the GPUs of jobs already stopping
    victims: dict[str, list[RunningJob]]  # preemptible jobs not stopping, by tenant
    borrowers: set[int]  # jobs that run only by borrowing
    stopping_jobs: list[RunningJob]  # in no particular order
    elastic: list[RunningJob]  # of the victims, those below their maximum size
    victim_ids: set[int]  # id() of every victim
    may_shrink: bool  # a victim runs above its minimum size
    all_healthy: bool  # every running job is on healthy nodes only (and no GPU is sick)


class RoundCache:
    def __init__(self):
        self._jobs: dict[int, RunningJob] = {}  # id(job) -> job, as of the last round (held: ids stay unique)
        self._healthy: set[str] | None = None
        self._guaranteed: dict[str, float] | None = None
        self.rebuilds = self.updates = 0  # for tests and benchmarks: how each round was served
        self._keys: dict[int, tuple] = {}  # id(queued job) -> (job, top, until, its queue key)
        self._cfg: Config | None = None
        self._plan, self._tables = None, ()
        self._rows: list[NodeState] = []
        self._reset()

    def _reset(self) -> None:
        self._used: dict[str, int] = defaultdict(int)
        self._wants: dict[str, int] = defaultdict(int)
        self._busy = self._stopping = 0
        self._running_tenants: dict[str, int] = {}  # tenant -> its running jobs (those with one)
        self._victims: dict[str, dict[int, RunningJob]] = defaultdict(dict)
        self._stopping_jobs: dict[int, RunningJob] = {}
        self._elastic: dict[int, RunningJob] = {}
        self._victim_ids: set[int] = set()
        self._shrinkable = 0  # victims above their minimum size
        self._starts: dict[str, list[tuple[float, int, int]]] = defaultdict(list)  # tenant -> sorted (start, id, GPUs)
        self._borrowers: dict[str, set[int]] = {}
        self._all_borrowers: set[int] = set()
        self._victim_lists: dict[str, list[RunningJob]] = {}  # per tenant, kept until its jobs change
        self._queued: dict[int, PendingJob] = {}  # id(job) -> job, the waiting jobs as of the last round
        self._waiting: dict[str, dict[int, PendingJob]] = {}  # tenant -> its waiting jobs (id -> job)
        self._cpu_only = 0  # waiting jobs that ask for no GPU
        self._queues: dict[str, tuple] = {}  # tenant -> (sorted queue, until, demand, memo)
        self._victim_facts: dict[str, tuple] = {}  # tenant -> (its victims list, what is known of it)
        self._off_healthy = 0  # jobs with a worker on a node that is not healthy (or not known)

    def derive(self, snap: Snapshot, healthy: set[str], guaranteed: dict[str, float], sick: bool) -> Derived:
        now = dict(zip(map(id, snap.running), snap.running))
        if healthy != self._healthy or guaranteed != self._guaranteed:
            self._reset()
            self._jobs = {}
            self._healthy, self._guaranteed = set(healthy), dict(guaranteed)
            self.rebuilds += 1
        else:
            self.updates += 1
        old = self._jobs
        came = [now[k] for k in filterfalse(old.__contains__, now)]  # in the snapshot's order
        # the jobs gone are looked for only if some are (every old one is still here otherwise)
        gone = list(filterfalse(now.__contains__, old)) if len(now) - len(came) != len(old) else ()
        changed: set[str] = set()
        for k in gone:
            job = self._jobs[k]
            self._count(job, -1)
            changed.add(job.tenant)
        for job in came:
            self._count(job, +1)
            changed.add(job.tenant)
        self._jobs = now
        for t in changed:
            old, new = self._borrowers.get(t, set()), self._borrowing(t)
            self._all_borrowers -= old
            self._all_borrowers |= new
            self._borrowers[t] = new
            self._victim_lists.pop(t, None)
        lists = self._victim_lists
        for t, js in self._victims.items():
            if js and t not in lists:
                lists[t] = list(js.values())
        # the tenants that run: in the order they first appear among the running jobs, as a walk
        # of them gives it, where a tenant the plan does not name runs (the entitlements put
        # those in that order); else in any order (they take the plan's: a walk saved a round)
        order = self._running_tenants
        if any(t not in guaranteed for t in order):
            order = dict.fromkeys(map(_tenant, snap.running))
        return Derived(
            used={t: self._used[t] for t in order}, wants={t: self._wants[t] for t in order if self._wants[t]},
            busy=self._busy, stopping=self._stopping,
            victims={t: lists[t] for t, js in self._victims.items() if js},  # shared: the round copies one it changes
            borrowers=self._all_borrowers,  # shared: a round only reads it
            stopping_jobs=list(self._stopping_jobs.values()), elastic=list(self._elastic.values()),
            victim_ids=self._victim_ids,  # shared: a round copies it before it stops a job (RoundState.stop)
            may_shrink=self._shrinkable > 0,
            all_healthy=not sick and self._off_healthy == 0)

    def pool(self, nodes: tuple[NodeState, ...]) -> tuple[FreePool, set[str], bool]:
        """``FreePool(nodes)``, the names of the healthy nodes and whether a GPU is sick, from
        what was kept of the last round's nodes: only the rows that are new objects are read,
        and only the buckets they move between are built again."""
        rows = self._rows
        if len(nodes) != len(rows) or any(a.name != b.name for a, b in zip(nodes, rows) if a is not b):
            rows = self._rows = list(nodes)
            base = FreePool(nodes)
            self._names, self._index, self._free = base.names, base.index, base.free
            self._cpus, self._mem, self._buckets, self._total = base.cpus, base.mem, base.buckets, base.total_free
            self._topo, self._gmem = base.topo, base.gmem
            self._node_healthy = {n.name for n in nodes if n.healthy}
            self._sick = {n.name for n in nodes if n.sick_gpus}
        else:
            moved: set[int] = set()
            for i in compress(range(len(nodes)), map(is_not, nodes, rows)):
                n = rows[i] = nodes[i]
                was = len(self._free[i])
                self._free[i] = sorted(n.free_gpus) if n.healthy else []
                self._cpus[i] = n.free_cpus if n.healthy else 0.0
                self._mem[i] = n.free_memory_mb if n.healthy else 0
                self._topo[i] = n.topology
                self._gmem[i] = n.gpu_memory_mb
                now = len(self._free[i])
                self._total += now - was
                if now != was:
                    while now >= len(self._buckets):
                        self._buckets.append(set())
                    self._buckets[was].discard(i)
                    self._buckets[now].add(i)
                    moved |= {was, now}
                (self._node_healthy.add if n.healthy else self._node_healthy.discard)(n.name)
                (self._sick.add if n.sick_gpus else self._sick.discard)(n.name)
            for k in moved:  # as a fresh pool fills them: the order place() reads them in
                self._buckets[k] = fresh_bucket(self._buckets[k])
        pool = FreePool.of_parts(self._names, self._index, self._free, self._cpus, self._mem, self._buckets,
                                 self._total, self._topo, self._gmem)
        return pool, set(self._node_healthy), bool(self._sick)

    def plan_tables(self, plan, build) -> tuple:
        """``build(plan)`` (round_state.plan_tables), kept while the plan is the same object."""
        if plan is not self._plan:
            self._plan, self._tables = plan, build(plan)
        return self._tables

    def _sort_queue(self, q: list[PendingJob], top: int, now: float, cfg: Config) -> None:
        """``q.sort(key=queue_key)``, with each job's key kept until it can change (its aged
        priority steps, its class is lifted, or its tenant's top priority moves): computing
        the keys of thousands of waiting jobs was a third of a deep-queue round. The keys
        stay for :meth:`waiting_class` to read in the same round."""
        if cfg is not self._cfg:
            self._keys, self._cfg = {}, cfg
        keys = self._keys
        if len(keys) > 4 * len(q) + 10_000:  # forget jobs that left the queues
            keys = self._keys = {}

        def key(job: PendingJob):
            kept = keys.get(id(job))
            if kept is None or kept[0] is not job or kept[1] != top or now >= kept[2]:
                kept = keys[id(job)] = (job, top, queue_key_until(job, now, cfg), queue_key(job, now, cfg, top))
            return kept[3]

        q.sort(key=key)

    def queues(self, snap: Snapshot) -> tuple[dict[str, list[PendingJob]], dict[str, int], bool]:
        """Each tenant's waiting jobs in queue order, as sorting by ``queue_key`` gives them
        (tenants in the order they first appear among ``snap.queued``, as a walk of it gives
        them), the GPUs each queue asks for (``RoundState.demand``'s part of it), and whether a
        job asks for no GPU. A tenant's sorted queue is kept while its waiting jobs are the
        same objects and none of their keys can change yet: a deep queue that did not change
        costs nothing but finding that none of its jobs came or went. The lists are the
        cache's: a round reads them and does not change them."""
        queued, now, cfg = snap.queued, snap.now, snap.config
        if cfg is not self._cfg:
            self._queues.clear()
        old, waiting, kept_queues = self._queued, self._waiting, self._queues
        cur = dict(zip(map(id, queued), queued))
        came = [cur[k] for k in filterfalse(old.__contains__, cur)]  # in the snapshot's order
        gone = [old[k] for k in filterfalse(cur.__contains__, old)] if len(cur) - len(came) != len(old) else ()
        for j in gone:
            jobs = waiting[j.tenant]
            del jobs[id(j)]
            if not jobs:
                del waiting[j.tenant]
            kept_queues.pop(j.tenant, None)
            self._cpu_only -= j.gpus_per_worker == 0
        for j in came:
            waiting.setdefault(j.tenant, {})[id(j)] = j
            kept_queues.pop(j.tenant, None)
            self._cpu_only += j.gpus_per_worker == 0
        self._queued = cur
        queues: dict[str, list[PendingJob]] = {}
        asks: dict[str, int] = {}
        for t in dict.fromkeys(map(_tenant, queued)):
            kept = kept_queues.get(t)
            if kept is None or now >= kept[1]:
                q = list(waiting[t].values())
                self._sort_queue(q, max(j.priority for j in q), now, cfg)
                keys = self._keys
                until = min(keys[id(j)][2] for j in q)
                demand = queue_gpus(q)
                kept = kept_queues[t] = (q, until, demand, {})  # the list holds its jobs: their ids stay unique
            queues[t], asks[t] = kept[0], kept[2]
        return queues, asks, self._cpu_only > 0

    def queue_memo(self, t: str, q: list[PendingJob]) -> dict | None:
        """What the round worked out from tenant ``t``'s queue ``q`` (order, classes); None if ``q``
        is not the list :meth:`queues` gave for ``t`` this round."""
        kept = self._queues.get(t)
        return kept[3] if kept is not None and kept[0] is q else None

    def least_needs(self, t: str, q: list[PendingJob]) -> list[int] | None:
        """For tenant ``t``'s queue ``q`` as :meth:`queues` gave it this round: at each position,
        the fewest GPUs any job from there on asks to start with (None if ``q`` is not that
        list). A walk of the queue that can start none of the rest stops there instead of
        trying each (policy.starts)."""
        memo = self.queue_memo(t, q)
        if memo is None:
            return None
        if "least" not in memo:
            least, out = 1 << 62, [0] * len(q)
            for i in range(len(q) - 1, -1, -1):
                least = out[i] = min(least, q[i].min_workers * q[i].gpus_per_worker)
            memo["least"] = out
        return memo["least"]

    def las_ready_at(self, t: str, victims: list[RunningJob], bar: float, priority: int, min_run: float) -> float:
        """The earliest time one of ``victims`` (tenant ``t``'s jobs that may be stopped) could be
        taken by least attained service for a head of ``priority``: run ``min_run`` seconds,
        attained service at ``bar`` (policy.least_attained's filter, solved for the time). Kept
        while the list is the same object (the cache hands out one per tenant until its jobs
        change; a round copies one it changes). Tenants blocked round after round whose jobs
        are all too young or too little served cost one comparison, not a walk of their jobs."""
        facts = self._about(t, victims)
        key = ("las", bar, priority, min_run)
        if key in facts:
            return facts[key]
        at = math.inf
        for j in victims:
            if j.priority > priority or not j.placement or not j.gpus_per_worker:
                continue
            if j.attained >= bar:
                reach = -math.inf
            elif j.attained_since is None:
                continue  # its service does not grow
            else:
                reach = j.attained_since + (bar - j.attained) / (len(j.placement) * j.gpus_per_worker)
            at = min(at, max(j.started_at + min_run, reach))
        facts[key] = at
        return at

    def lowest_priority(self, t: str, victims: list[RunningJob]) -> float:
        """The lowest priority among ``victims`` (tenant ``t``'s jobs that may be stopped; inf if
        none), kept as :meth:`las_ready_at` is: a head preempts within its tenant only jobs
        of a lower priority, and most tenants have none."""
        facts = self._about(t, victims)
        if "lowest" not in facts:
            facts["lowest"] = min((j.priority for j in victims), default=math.inf)
        return facts["lowest"]

    def _about(self, t: str, victims: list[RunningJob]) -> dict:
        """What is known of tenant ``t``'s victims list while it is the same object."""
        kept = self._victim_facts.get(t)
        if kept is None or kept[0] is not victims:
            kept = self._victim_facts[t] = (victims, {})
        return kept[1]

    def waiting_class(self, job: PendingJob) -> int | None:
        """A queued job's class as its queue key of this round says it (None if not kept)."""
        kept = self._keys.get(id(job))
        return kept[3][1] if kept is not None and kept[0] is job else None

    def _count(self, job: RunningJob, sign: int) -> None:
        """Add ``job`` to what is kept (``sign`` 1) or take it off (-1)."""
        healthy, t, placement = self._healthy, job.tenant, job.placement
        gpus = len(placement) * job.gpus_per_worker
        on_healthy = sum(len(w.gpus) for w in placement if w.node in healthy)
        self._used[t] += sign * gpus
        n = self._running_tenants[t] = self._running_tenants.get(t, 0) + sign
        if not n:
            del self._running_tenants[t]
        self._busy += sign * on_healthy
        if not all(w.node in healthy for w in placement):
            self._off_healthy += sign
        if job.stopping:
            self._stopping += sign * on_healthy
            if sign > 0:
                self._stopping_jobs[id(job)] = job
            else:
                del self._stopping_jobs[id(job)]
        elif job.max_workers > len(placement):
            self._wants[t] += sign * (job.max_workers - len(placement)) * job.gpus_per_worker
        if job.preemptible and not job.stopping:
            elastic = job.max_workers > len(placement)
            self._shrinkable += sign * (job.max_workers > job.min_workers)
            if sign > 0:
                self._victims[t][id(job)] = job
                self._victim_ids.add(id(job))
                if elastic:
                    self._elastic[id(job)] = job
            else:
                del self._victims[t][id(job)]
                self._victim_ids.discard(id(job))
                if elastic:
                    del self._elastic[id(job)]
        starts = self._starts[t]
        key = (job.started_at, job.id, gpus)
        if sign > 0:
            bisect.insort(starts, key)
        else:
            del starts[bisect.bisect_left(starts, key)]

    def _borrowing(self, t: str) -> set[int]:
        """round_state.borrowing_jobs for one tenant: in start order, the job that crosses its
        guarantee and those after it borrow."""
        used, limit, out = 0, self._guaranteed.get(t, 0), set()
        for _, job_id, gpus in self._starts[t]:
            used += gpus
            if used > limit:
                out.add(job_id)
        return out
