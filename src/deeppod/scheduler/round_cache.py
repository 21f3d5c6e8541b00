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
from collections import defaultdict
from dataclasses import dataclass
from itertools import compress
from operator import attrgetter, is_not

from deeppod.scheduler.pool import FreePool, fresh_bucket
from deeppod.scheduler.queue_order import queue_key, queue_key_until
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
        self._victims: dict[str, dict[int, RunningJob]] = defaultdict(dict)
        self._stopping_jobs: dict[int, RunningJob] = {}
        self._elastic: dict[int, RunningJob] = {}
        self._victim_ids: set[int] = set()
        self._shrinkable = 0  # victims above their minimum size
        self._starts: dict[str, list[tuple[float, int, int]]] = defaultdict(list)  # tenant -> sorted (start, id, GPUs)
        self._borrowers: dict[str, set[int]] = {}
        self._all_borrowers: set[int] = set()
        self._victim_lists: dict[str, list[RunningJob]] = {}  # per tenant, kept until its jobs change
        self._queues: dict[str, tuple] = {}  # tenant -> (ids, sorted queue, until, demand)
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
        gone = self._jobs.keys() - now.keys()
        came = [now[k] for k in now.keys() - self._jobs.keys()]
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
        # in the order the tenants first appear among the running jobs, as a walk of them would
        # give it: the entitlements' water-filling visits tenants in that order
        order = dict.fromkeys(map(_tenant, snap.running))
        return Derived(
            used={t: self._used[t] for t in order}, wants={t: self._wants[t] for t in order if self._wants[t]},
            busy=self._busy, stopping=self._stopping,
            victims={t: lists[t] for t, js in self._victims.items() if js},  # shared: the round copies one it changes
            borrowers=self._all_borrowers,  # shared: a round only reads it
            stopping_jobs=list(self._stopping_jobs.values()), elastic=list(self._elastic.values()),
            victim_ids=set(self._victim_ids), may_shrink=self._shrinkable > 0,
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
                                 self._total)
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

    def queue(self, t: str, q: list[PendingJob], now: float, cfg: Config) -> int:
        """Sort tenant ``t``'s queue ``q`` in place, as ``_sort_queue`` would, and return the GPUs
        it asks for (``RoundState.demand``'s part of it). Kept whole while the tenant's waiting
        jobs are the same objects and none of their keys can change yet: then the last order
        is this one (a deep queue that did not change costs a set of ids, not a key a job)."""
        ids = set(map(id, q))
        kept = self._queues.get(t)
        if kept is not None and kept[0] == ids and now < kept[2] and cfg is self._cfg:
            q[:] = kept[1]
            return kept[3]
        top = max(j.priority for j in q)
        self._sort_queue(q, top, now, cfg)
        keys = self._keys
        until = min(keys[id(j)][2] for j in q)
        demand = sum((j.resize_to or j.top_workers) * j.gpus_per_worker for j in q)
        self._queues[t] = (ids, list(q), until, demand, q)  # q held: the ids stay unique
        return demand

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
