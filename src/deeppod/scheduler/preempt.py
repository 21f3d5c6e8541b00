"""Making room for a waiting job (as Kueue keeps preemption apart from admission): free GPUs
first, GPUs already on their way back, then elastic jobs shrunk toward their minimum, then
whole jobs preempted, least work lost first and never taking a donor below what it may
give; gangs of several-GPU workers get whole nodes cleared (``take_back_nodes``), moving
jobs that run within a guarantee onto free GPUs elsewhere when nothing else clears one
(``move_for``, ``_Clearing``). The phases in policy.py call ``Preemption.take_back``."""

from __future__ import annotations

import math
from collections import defaultdict
from itertools import compress
from operator import not_

from deeppod.scheduler.pool import FreePool
from deeppod.scheduler.round_state import RoundState, loss_key, slots
from deeppod.scheduler.snapshot import PendingJob, RunningJob


class Preemption:
    """The round's ways to make room; what they decide goes into ``st`` (evictions, shrinks,
    earmarked GPUs, nodes kept clear)."""

    def __init__(self, st: RoundState):
        self.st = st

    def take_back(self, t: str, head: PendingJob, floor_of, allow_preempt: bool, why: str) -> bool:
        """Make room for ``head`` of tenant ``t``: free GPUs, GPUs already on their way
        back, then elastic shrinks, then (if allowed) whole-job preemptions. ``floor_of(v)``
        is how many GPUs donor ``v`` may give up."""
        st = self.st
        need = head.min_workers * head.gpus_per_worker
        pool, gmem = st.pool, head.gpu_memory_mb
        some_nodes = need and gmem and not all(pool.gpus_fit(i, gmem) for i in range(len(pool.names)))
        if head.gpus_per_worker > 1 or some_nodes:
            # room on some nodes, not anywhere: a count of free GPUs would mislead
            return allow_preempt and self.take_back_nodes(t, head, floor_of, why)
        now_free = min(need, st.avail())
        short = need - now_free
        incoming = max(0.0, st.stopping_gpus - st.claimed_incoming)
        if short > incoming:
            deficit = short - incoming
            if not allow_preempt and not st.may_shrink():
                return False  # only shrinks may make room, and no job can shrink: no donor to weigh
            donors = [v for v in st.victims if v != t and
                      (floor_of(v) > 0 or (allow_preempt and any(j.id in st.borrowers for j in st.victims[v])))]
            budget = {v: floor_of(v) for v in donors}
            resize, gained = self.plan_shrinks(donors, budget, deficit, allow_preempt)
            evict: list[RunningJob] = []
            if allow_preempt:
                evict, gained = self.plan_evictions(donors, budget, resize, deficit, gained)
            if gained < deficit:
                return False
            for job in evict:
                st.evict(job, why)
            for job in st.running:
                if job.id in resize:
                    st.shrink(job, resize[job.id], why)
            st.stopping_gpus += gained  # on their way back now; what this tenant does not need, the next may use
        st.claimed_incoming += short
        st.held_for[t] += now_free
        return True

    def plan_shrinks(self, donors: list[str], budget: dict[str, float], deficit: float,
                      any_age: bool) -> tuple[dict[int, int], float]:
        """Elastic jobs of the donors shrunk toward their minimum, least work lost first,
        within each donor's budget: {job id: new size} and the GPUs that frees."""
        st = self.st
        shrinks = [job for v in donors for job in st.victims[v]
                   if job.max_workers > job.min_workers and st.planned.get(job.id, job.workers) > job.min_workers
                   and job.gpus_per_worker
                   and (any_age or st.now - job.started_at >= st.cfg.resize_window(job.in_place))]
        shrinks.sort(key=lambda j: loss_key(j, st.now))
        resize: dict[int, int] = {}
        gained = 0.0
        for job in shrinks:
            if gained >= deficit:
                break
            per_worker, size = job.gpus_per_worker, st.planned.get(job.id, job.workers)
            spare = min(size - job.min_workers, slots(budget[job.tenant], per_worker),
                        math.ceil((deficit - gained) / per_worker))
            if spare > 0:
                resize[job.id] = size - spare
                budget[job.tenant] -= spare * per_worker
                gained += spare * per_worker
        return resize, gained

    def plan_evictions(self, donors: list[str], budget: dict[str, float], resize: dict[int, int],
                        deficit: float, gained: float) -> tuple[list[RunningJob], float]:
        """Whole jobs to preempt, least work lost first: first those whose loss leaves their
        tenant at or above its guarantee; only then borrowing jobs that take it below (it
        would come back asking for its own). A planned shrink of an evicted job is dropped.
        If that order falls short (a small job taken first can leave a donor's budget too
        small for the borrowing job that would have covered it), borrowing jobs are tried
        first, biggest first, in one pass. Returns the jobs and ``gained`` plus what they free; ``budget``
        and ``resize`` are updated for the plan that covers the deficit."""
        st = self.st
        victims = [job for v in donors for job in st.victims[v] if job.gpus]
        plans = ((sorted(victims, key=lambda j: loss_key(j, st.now)), (False, True)),
                 (sorted(victims, key=lambda j: (j.id not in st.borrowers, -j.gpus, loss_key(j, st.now))),
                  (None,)))
        first = None
        for order, passes in plans:
            b, r = dict(budget), dict(resize)
            evict, got = self.evict_in_order(order, passes, b, r, deficit, gained)
            if got >= deficit:
                budget.update(b)
                resize.clear()
                resize.update(r)
                return evict, got
            first = first or (evict, got)
        return first

    def evict_in_order(self, preempts: list[RunningJob], passes: tuple, budget: dict[str, float],
                        resize: dict[int, int], deficit: float, gained: float) -> tuple[list[RunningJob], float]:
        """One plan: ``passes`` (False, True) takes the jobs that leave their tenant at or
        above its guarantee before those that cross it; (None,) takes both in one pass."""
        st = self.st
        evict: list[RunningJob] = []
        own = set(st.lost_own)
        for crossing in passes:
            for job in preempts:
                if gained >= deficit:
                    break
                if job in evict:
                    continue
                rest = resize.get(job.id, st.planned.get(job.id, job.workers)) * job.gpus_per_worker
                crosses = rest > budget[job.tenant]
                if crossing is not None and crosses != crossing:
                    continue
                if crosses and (job.id not in st.borrowers or job.tenant in own):
                    continue  # it runs within its tenant's guarantee, or the tenant gave one up already
                if job.id not in st.borrowers:
                    own.add(job.tenant)
                resize.pop(job.id, None)
                evict.append(job)
                budget[job.tenant] -= rest
                gained += rest
        return evict, gained

    def take_back_nodes(self, t: str, head: PendingJob, floor_of, why: str) -> bool:
        """Reclaim for workers of several GPUs each, which need that many free on one node:
        clear the nodes that cost least (fewest jobs, least progress lost), counting GPUs
        already on their way back as free, never taking a donor below its floor. If no
        node can be cleared that way, jobs may be moved off (``_move_for``)."""
        st = self.st
        pool, per_worker = st.pool, head.gpus_per_worker
        free_on = [len(f) for f in pool.free]
        for where in st.coming_back():
            for i, n in where:
                free_on[i] += n
        gmem = head.gpu_memory_mb  # without it, every node fits: no walk over them to say so
        fit = [pool.gpus_fit(i, gmem) for i in range(len(pool.names))] if gmem else [True] * len(pool.names)
        for i in compress(range(len(fit)), map(not_, fit)) if gmem else ():
            free_on[i] = 0  # its GPUs are too small for this job: nothing there is room for it
        whole = [i for i, f in enumerate(free_on) if f >= per_worker and pool.names[i] in st.healthy]
        missing = head.min_workers - sum(free_on[i] // per_worker for i in whole)
        if missing <= 0:
            if sum(len(pool.free[i]) // per_worker for i in range(len(pool.names)) if fit[i]) >= head.min_workers:
                self.hold_for(t, head)  # it can start now: keep them for it
            elif st.cfg.defragment:  # whole once their jobs have stopped: the fullest first
                whole.sort(key=lambda i: (-free_on[i], i))
                enough = next(k for k in range(1, len(whole) + 1)
                              if sum(free_on[i] // per_worker for i in whole[:k]) >= head.min_workers)
                self.keep_clear(whole[:enough])
            return True
        start = (list(free_on), list(whole), missing)  # for _move_for, before this plan's evictions
        # by identity, in order: a value comparison of jobs (every field) made this round
        # quadratic in the running jobs (11 million comparisons at 10,000 GPUs). A victim is
        # preemptible, neither stopping nor on a sick node, and not yet leaving.
        stoppable = st.victim_ids
        on_node: dict[int, dict[int, RunningJob]] = defaultdict(dict)
        for job, where in st.spans():
            if id(job) in stoppable and job.tenant != t:
                for i, _ in where:
                    if fit[i]:
                        on_node[i].setdefault(id(job), job)
        budget = {v: floor_of(v) for v in st.victims if v != t}
        chosen: list[RunningJob] = []
        cleared: list[int] = []
        for _ in range(missing):
            best = None
            for i, jobs in on_node.items():
                picked = self.clear_node(i, list(jobs.values()), per_worker - free_on[i] % per_worker, chosen, budget)
                if picked is not None:
                    cost = (len(picked), sum(j.gpus for j in picked), [loss_key(j, st.now) for j in picked])
                    if best is None or cost < best[0]:
                        best = (cost, picked, i)
            if best is None:
                return st.cfg.defragment and self.move_for(t, head, *start, floor_of, why)
            cleared.append(best[2])
            for job in best[1]:
                chosen.append(job)
                budget[job.tenant] -= job.gpus
                for w in job.placement:
                    i = pool.index.get(w.node)
                    if i is not None:
                        free_on[i] += len(w.gpus)
                        on_node[i].pop(id(job), None)
        for job in chosen:
            st.evict(job, why)
        # nothing earmarked: the GPUs it needs are on the nodes being cleared, not the free ones
        if st.cfg.defragment:
            self.keep_clear(whole + cleared)
        return True

    def hold_for(self, t: str, head: PendingJob) -> None:
        """Take the GPUs ``head`` will start on out of the pool for this round: a count
        earmarked for it would not stop a whole node from going to another tenant's job."""
        st = self.st
        placement = st.pool.place(head.min_workers, head.gpus_per_worker, head.cpus_per_worker,
                                  head.memory_mb_per_worker, head.avoid, head.gpu_memory_mb) \
            if st.cfg.defragment else None
        if placement is None:  # defragment off, or CPUs or memory are short: a count
            st.held_for[t] += min(head.min_workers * head.gpus_per_worker, st.avail_for(head))
        else:
            st.node_hold[t] = (head.id, placement)

    def keep_clear(self, nodes: list[int]) -> None:
        """Nodes that become whole once their stopping jobs are gone: nothing else may start
        on their free GPUs meanwhile (the fullest-node-first placement would pick them)."""
        st = self.st
        for i in set(nodes):
            if st.pool.free[i]:
                st.pool.take(i, list(st.pool.free[i]), 0, 0)

    def move_for(self, t: str, head: PendingJob, free_on: list[int], whole: list[int], missing: int,
                  floor_of, why: str) -> bool:
        """No node can be cleared for ``head``'s gang by evicting jobs that borrow: clear the
        cheapest nodes (fewest GPUs in use) by evicting what borrows there, within the
        donors' budgets, and moving the other jobs onto free GPUs of other nodes (evicting
        more borrowing jobs elsewhere if that is what makes room for them). A moved job is
        checkpointed and requeued and starts again on that room in the next round, so its
        tenant keeps its share; the cleared nodes are kept clear until the gang starts."""
        st = self.st
        pool, per_worker, cfg = st.pool, head.gpus_per_worker, st.cfg
        since = head.queued_at if head.queued_at is not None else head.submitted_at
        if st.now - since < cfg.reserve_after_seconds:
            return False  # a gang that has just arrived waits for nodes to drain by themselves first
        on_node: dict[int, list[RunningJob]] = defaultdict(list)
        for job in st.running:
            if not (job.stopping or job.id in st.leaving or job.id in st.gone):
                for i in {pool.index[w.node] for w in job.placement if w.node in pool.index}:
                    on_node[i].append(job)
        trial = pool.copy()
        for i in whole:
            trial.take(i, list(trial.free[i]), 0, 0)
        plan = _Clearing(self.st, t, trial, set(whole), {v: floor_of(v) for v in st.victims if v != t})
        order = sorted((per_worker - free_on[i] % per_worker, i) for i in on_node
                       if i not in plan.targets and pool.names[i] in st.healthy
                       and pool.gpus_fit(i, head.gpu_memory_mb))
        cleared: list[int] = []
        for _, i in order:
            if len(cleared) >= missing:
                break
            if plan.clear(i, on_node[i]):
                cleared.append(i)
        if len(cleared) < missing or plan.pool.total_free < st.held_for.total:
            return False
        for job in plan.evicted:
            st.evict(job, why)
        for job in plan.moved:
            st.stop(job, f"moved to free GPUs on other nodes: {why}; whole nodes are cleared for it")
        self.keep_clear(whole + cleared)
        return True

    def clear_node(self, i: int, jobs: list[RunningJob], want: int, chosen: list[RunningJob],
                    budget: dict[str, float]) -> list[RunningJob] | None:
        """The jobs on node ``i`` whose eviction frees ``want`` GPUs there, least loss first,
        within the donors' budgets; None if that cannot be done."""
        st = self.st
        picked, freed, spent = [], 0, defaultdict(float)
        own_here = {j.tenant for j in chosen if j.id not in st.borrowers}
        taken = {id(j) for j in chosen}
        for job in sorted(jobs, key=lambda j: loss_key(j, st.now)):
            if freed >= want or id(job) in taken:
                continue
            within = job.gpus + spent[job.tenant] <= budget.get(job.tenant, 0)
            if job.id not in st.borrowers and not within:
                continue  # it runs within its tenant's guarantee
            if not within and (job.tenant in st.lost_own or job.tenant in own_here):
                continue  # the tenant gives up a job of its own here: nothing past its guarantee
            if job.id not in st.borrowers:
                own_here.add(job.tenant)
            picked.append(job)
            spent[job.tenant] += job.gpus
            freed += sum(len(w.gpus) for w in job.placement if w.node == st.pool.names[i])
        return picked if freed >= want else None


class _Clearing:
    """A plan, built node by node, that clears nodes for a gang by evicting jobs that borrow
    and moving the others elsewhere (``Preemption.move_for``). ``pool`` is the free GPUs once
    the plan has run: GPUs of planned jobs off the nodes being cleared come back to it, and
    moved jobs take theirs from it."""

    def __init__(self, st: RoundState, tenant: str, pool: FreePool, targets: set[int], budget: dict[str, float]):
        self.st, self.tenant, self.pool, self.targets, self.budget = st, tenant, pool, targets, budget
        self.evicted: list[RunningJob] = []
        self.moved: list[RunningJob] = []
        self.landed: set[int] = set()  # nodes moved jobs are planned onto: they cannot be cleared
        self.stoppable = set(st.victim_ids)  # preemptible, not stopping

    def clear(self, i: int, jobs: list[RunningJob]) -> bool:
        """Add node ``i`` to the plan if everything on it can be evicted or moved."""
        if i in self.landed:
            return False
        st, pool, budget = self.st, self.pool.copy(), dict(self.budget)
        targets = self.targets | {i}
        pool.take(i, list(pool.free[i]), 0, 0)
        evicted, moved = [], []
        planned = set(map(id, self.evicted + self.moved))

        def release(job: RunningJob) -> None:
            for w in job.placement:
                k = pool.index.get(w.node)
                if k is not None and k not in targets and w.node in st.healthy:
                    pool.give(w.node, w.gpus, w.cpus, w.memory_mb)

        def may_evict(job: RunningJob) -> bool:
            return (job.tenant != self.tenant and job.id in st.borrowers and job.gpus <= budget.get(job.tenant, 0)
                    and id(job) in self.stoppable)

        for job in sorted(jobs, key=lambda j: loss_key(j, st.now)):
            if id(job) in planned:
                continue
            if may_evict(job):
                evicted.append(job)
                budget[job.tenant] -= job.gpus
            elif (job.gpus and id(job) in self.stoppable
                  and st.now - job.started_at >= st.cfg.min_run_before_las_preempt):
                moved.append(job)
            else:
                return False  # it may not be stopped (or ran too briefly to be moved)
            release(job)
        spare = None  # borrowing jobs elsewhere, least loss first: built only if a moved job needs room
        landed = set()
        for job in moved:
            w0 = job.placement[0]
            while (got := pool.place(job.workers, job.gpus_per_worker, w0.cpus, w0.memory_mb,
                                     gmem=job.gpu_memory_mb)) is None:
                if spare is None:
                    here = planned | set(map(id, jobs))
                    spare = sorted((j for js in st.victims.values() for j in js
                                    if id(j) not in here and j.id in st.borrowers), key=lambda j: loss_key(j, st.now))
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
