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

from deeppod.scheduler.pool import FreePool
from deeppod.scheduler.preempt import Preemption
from deeppod.scheduler.queue_order import effective_priority, queue_key, service_class, waiting_class
from deeppod.scheduler.round_cache import RoundCache
from deeppod.scheduler.round_state import RoundState, borrowing_jobs, loss_key, slots
from deeppod.scheduler.snapshot import (
    Decisions,
    PendingJob,
    Preempt,
    Resize,
    RunningJob,
    Snapshot,
    Start,
    Wait,
    attained_at,
)

__all__ = ["borrowing_jobs", "effective_priority", "queue_key", "schedule", "service_class", "waiting_class"]


def schedule(snap: Snapshot, cache: RoundCache | None = None) -> Decisions:
    """One round: the phases in the order the module's docstring gives. ``cache``: what the
    last round derived from the running jobs, brought up to date instead of walked again
    (round_cache.py); the decisions are the same with it or without."""
    return _Round(snap, cache).run()


class _Round:
    """One round: each phase a method, reading and changing the round's state (``st``,
    round_state.RoundState); making room for a waiting job is preempt.py's."""

    def __init__(self, snap: Snapshot, cache: RoundCache | None = None):
        self.st = RoundState.of(snap, cache)
        self.preempt = Preemption(self.st)

    def run(self) -> Decisions:
        st = self.st
        self.health()
        self.candidates()
        self.reclaim()
        self.fair_share()
        if st.cfg.priority_preemption:
            self.priority()
        if st.cfg.las_preemption and st.cfg.las_thresholds:
            self.least_attained()
        self.starts()
        if st.cfg.grow and st.pool.total_free > 0:
            self.grow()
        return st.out

    # the phases -------------------------------------------------------------------
    def health(self) -> None:
        """1. Jobs on unhealthy nodes or GPUs are preempted; they requeue and avoid them."""
        st = self.st
        if st.derived is not None and st.derived.all_healthy:
            return  # the cache counted the jobs on nodes that are not healthy: none
        sick = {(n.name, g) for n in st.snap.nodes for g in n.sick_gpus}
        healthy = st.healthy
        for job in st.running:
            if job.stopping or (not sick and all(w.node in healthy for w in job.placement)):
                continue  # the usual case, without the sets and sorts below
            bad = sorted({w.node for w in job.placement} - st.healthy)
            bad_gpu = sorted((w.node, g) for w in job.placement for g in w.gpus if (w.node, g) in sick)
            if bad:
                why = f"node {bad[0]} is unhealthy; the job is requeued on healthy nodes"
            elif bad_gpu:
                why = f"GPU {bad_gpu[0][1]} of node {bad_gpu[0][0]} is unhealthy; the job is requeued on healthy GPUs"
            else:
                continue
            st.out.preempts.append(Preempt(job.id, why))
            st.gone.add(job.id)

    def candidates(self) -> None:
        """After health: the jobs later phases may shrink or preempt, and which of them borrow."""
        st = self.st
        victims, ids, gone = st.victims, st.victim_ids, st.gone
        if st.derived is not None and st.derived.all_healthy:  # nothing gone: the cache's, as they are
            for t, jobs in st.derived.victims.items():
                victims[t] = jobs
            st.victim_ids = st.derived.victim_ids
            st.borrowers = st.derived.borrowers
            return
        for job in st.running:
            if job.preemptible and not job.stopping and job.id not in gone:
                victims[job.tenant].append(job)
                ids.add(id(job))
        st.borrowers = borrowing_jobs(st.running, st.tenants.guaranteed)

    def reclaim(self) -> None:
        """2. Guarantee reclaim, neediest tenant first."""
        st = self.st
        tenants = st.tenants
        reclaiming = sorted((t for t in st.queues if tenants.usage[t] < tenants.guaranteed[t]),
                            key=lambda t: (tenants.usage[t] / max(tenants.guaranteed[t], 1e-9), t))
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
            tried: set[tuple[int, int, int]] = set()
            room = tenants.guaranteed[t] - tenants.usage[t]
            for head in st.queues[t]:
                need = head.min_workers * head.gpus_per_worker
                shape = (head.min_workers, head.gpus_per_worker, head.gpu_memory_mb)
                if not 0 < need <= room:
                    continue
                if st.cfg.earmark_free and head.gpus_per_worker == 1 and need <= st.avail_for(head):
                    st.held_for[t] += need
                    st.reclaim_for.setdefault(t, set()).add(head.id)
                    room -= need
                    continue
                if shape in tried:
                    continue
                tried.add(shape)
                why = (f"reclaim for tenant {t}: it uses {tenants.usage[t]:g} of its {tenants.guaranteed[t]:g} "
                       "guaranteed GPUs "
                       f"and job {head.id} waits for {need}")
                if self.preempt.take_back(t, head, tenants.above_guarantee, True, why):
                    st.reclaim_for.setdefault(t, set()).add(head.id)
                    break
                if len(tried) == 1:
                    st.out.waits.append(Wait(head.id, f"tenant {t} is below its guarantee; no jobs can be "
                                                        "preempted to make room for this gang yet"))
                if len(tried) >= 3:
                    break

    def fair_share(self) -> None:
        """3. Fair-share contention: shrink (never preempt) tenants above their share."""
        st = self.st
        tenants = st.tenants
        for t in sorted(st.queues, key=lambda t: (st.share_used(t), t)):
            head = st.queues[t][0]
            need = head.min_workers * head.gpus_per_worker
            if need == 0 or st.held_for[t] >= need or tenants.usage[t] + need > st.entitled.get(t, 0) + 1e-9:
                continue
            if st.avail_for(head) + st.held_for[t] >= need:
                continue
            self.preempt.take_back(t, head, lambda v: min(tenants.usage[v] - st.entitled.get(v, 0),
                                                          tenants.above_guarantee(v)),
                                   False, f"fair share for tenant {t}: job {head.id} waits and it is below its share")

    def priority(self) -> None:
        """4. Within a tenant, a higher-priority head preempts lower-priority jobs."""
        st = self.st
        for t, q in st.queues.items():
            head = q[0]
            need = head.min_workers * head.gpus_per_worker
            if need == 0 or st.avail_for(head) + st.held_for[t] >= need:
                continue
            if not st.has_lower_victim(t, head.priority):
                continue  # none of its jobs has a lower priority: nothing to preempt
            lower = sorted((j for j in st.victims.get(t, []) if j.priority < head.priority),
                           key=lambda j: (j.priority, *loss_key(j, st.now)))
            short, chosen = need - st.avail_for(head) - st.held_for[t], []
            for job in lower:
                if short <= 0:
                    break
                freed = st.planned.get(job.id, job.workers) * job.gpus_per_worker
                if head.gpu_memory_mb:  # only its GPUs on nodes with the head's memory are room for it
                    freed = sum(len(w.gpus) for w in job.placement if w.node in st.pool.index
                                and st.pool.gpus_fit(st.pool.index[w.node], head.gpu_memory_mb))
                    if not freed:
                        continue
                chosen.append(job)
                short -= freed
            if short <= 0:
                for job in chosen:
                    st.evict(job, f"job {head.id} of tenant {t} has higher priority "
                                     f"({head.priority} > {job.priority})")
                st.held_for[t] += min(need, st.avail())

    def least_attained(self) -> None:
        """5. A waiting job of a lower service class takes GPUs from jobs of a higher class
        of its own tenant (with ``las_across_tenants``, also from jobs that borrow, while its
        tenant is within its share and never below the donor's guarantee). Highest class and
        most service first; an elastic victim is shrunk rather than stopped where that is
        enough. Tenants are taken neediest first. Room is made for the tenant's waiting
        jobs of the head's class together (``las_jobs_per_round``); if not all of them can
        have it, for as many as can, the head at least."""
        st = self.st
        tenants, cfg = st.tenants, st.cfg
        needs, blocked = self._las_blocked()
        bars = sorted(cfg.las_thresholds)
        for t in sorted(blocked, key=blocked.get):
            head = st.queues[t][0]
            per_worker = head.gpus_per_worker
            head_need = head.min_workers * per_worker
            # workers of several GPUs need whole nodes cleared: they wait for a reservation
            # instead, so that clearing nodes for them does not leave GPUs idle meanwhile
            if per_worker != 1:
                continue
            mine = st.waiting_class(head)
            if mine >= len(bars):
                continue  # no class above the head's
            need = needs[t] if t in needs else self._las_need(t)
            within = tenants.usage[t] + head_need <= max(tenants.guaranteed[t], st.entitled.get(t, 0)) + 1e-9
            # a class above ``mine`` is more than ``mine`` thresholds passed: attained at or
            # past the next threshold up (one comparison a victim, not a class each)
            bar = bars[mine]
            # its own tenant's jobs, and (across tenants) the others' borrowing jobs
            others = [j for j in st.borrowing_victims() if j.tenant != t and id(j) in st.victim_ids] \
                if cfg.las_across_tenants and within else []
            if not others and st.now < st.las_ready_at(t, bar, head.priority) - 1e-3:
                continue  # none of its own jobs passes the filter below yet (1 ms: rounding)
            cands = [j for j in [*st.victims.get(t, ()), *others]
                     if j.priority <= head.priority and j.placement and j.gpus_per_worker
                     and st.now - j.started_at >= cfg.min_run_before_las_preempt and attained_at(j, st.now) >= bar]
            if not cands:
                continue
            served = {id(j): attained_at(j, st.now) for j in cands}
            cands.sort(key=lambda j: (-service_class(served[id(j)], cfg.las_thresholds), -served[id(j)], j.id))
            have = st.avail() + st.held_for[t]
            budget: dict[str, float] = defaultdict(float)
            plan: list[tuple[RunningJob, int | None]] = []  # (job, new size or None to stop it)
            for job in cands:
                size = st.planned.get(job.id, job.workers)
                if job.tenant != t:
                    room = tenants.above_guarantee(job.tenant) - budget[job.tenant]
                    if room < job.gpus_per_worker:
                        continue
                else:
                    room = math.inf
                shrinkable = (job.gpus_per_worker == 1 and size > job.min_workers
                              and st.now - job.started_at >= cfg.resize_window(job.in_place))
                if shrinkable:
                    give = min(size - job.min_workers, slots(room, 1), math.ceil(need - have))
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
            now_free = min(need, st.avail())
            for job, new in plan:
                ran = f"; this job has run {served[id(job)] / 3600:.1f} GPU-hours"
                if new is None:
                    st.evict(job, why + ran)
                else:
                    st.shrink(job, new, why + ran)
            st.held_for[t] += now_free

    def _las_blocked(self) -> tuple[dict[str, int], dict[str, tuple]]:
        """The tenants least attained service is for, with their start ranks: those the GPUs
        for their head and the jobs of its class behind it (``_las_need``) are not there for.
        Where even the head's are not, a tenant is blocked without counting the rest (most
        tenants, most rounds); the needs counted are returned too."""
        st = self.st
        needs: dict[str, int] = {}
        blocked: dict[str, tuple] = {}
        avail = st.avail()
        for t, q in st.queues.items():
            head_need = q[0].min_workers * q[0].gpus_per_worker
            if head_need <= 0:
                continue  # no GPUs asked, nothing to take (and then no jobs behind it count)
            if head_need <= avail + st.held_for[t]:
                needs[t] = self._las_need(t)
                if needs[t] <= avail + st.held_for[t]:
                    continue
            blocked[t] = self._start_rank(t)
        return needs, blocked

    def _las_need(self, t: str) -> int:
        """GPUs for tenant ``t``'s head and the 1-GPU-per-worker jobs right behind it in the
        same priority and class (up to ``las_jobs_per_round`` jobs)."""
        st = self.st
        cfg = st.cfg
        memo = st.queue_memo(t)
        if memo is not None and ("las", cfg.las_jobs_per_round) in memo:
            return memo["las", cfg.las_jobs_per_round]  # the same order and classes: the same count
        head, *rest = st.queues[t][:max(1, cfg.las_jobs_per_round)]
        need = head.min_workers * head.gpus_per_worker
        if head.gpus_per_worker == 1:
            mine = st.waiting_class(head)
            for j in rest:
                if j.gpus_per_worker != 1 or j.priority != head.priority or st.waiting_class(j) != mine:
                    break
                need += j.min_workers
        if memo is not None:
            memo["las", cfg.las_jobs_per_round] = need
        return need

    def starts(self) -> None:
        """6. Starts, tenant by tenant, neediest first; each tenant's queue in order until
        one of its jobs starts (then the tenants are ranked again)."""
        st = self.st
        st.nonlendable = st.tenants.nonlendable_idle()
        heap = [self._start_rank(t) for t in st.queues]
        heapq.heapify(heap)
        pos = {t: 0 for t in st.queues}
        st.reserved = False
        cpu_only = st.cpu_only
        st.failed_need: dict[tuple[int, int], int] = {}  # (GPUs per worker, GPU MiB) -> smallest gang unplaced
        waited = {w.job_id for w in st.out.waits}
        st.reported = {t for t, q in st.queues.items() if q[0].id in waited}
        while heap:
            t = heapq.heappop(heap)[-1]
            q = st.queues[t]
            least = st.least_needs(t)
            while pos[t] < len(q):
                job = q[pos[t]]
                pos[t] += 1
                if self._try_start(t, job):
                    heapq.heappush(heap, self._start_rank(t, pos[t]))
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

    def grow(self) -> None:
        """7. Grow elastic jobs into GPUs nobody queued can use."""
        st = self.st
        tenants = st.tenants
        # the elastic ones among the jobs that may be stopped (the cache keeps them apart)
        elastic = (j for j in st.derived.elastic if id(j) in st.victim_ids) if st.derived is not None \
            else (j for t in st.victims for j in st.victims[t])
        growable = [j for j in elastic
                    if j.id not in st.planned and j.max_workers > j.workers and j.gpus_per_worker
                    and st.now - j.started_at >= st.cfg.resize_window(j.in_place)]
        growable.sort(key=lambda j: (st.share_used(j.tenant), j.id))
        for job in growable:
            extra = min(job.max_workers - job.workers, slots(st.avail(), job.gpus_per_worker),
                        slots(tenants.cap_room(job.tenant), job.gpus_per_worker))
            if job.gpu_memory_mb:  # only free GPUs with its memory are room for it
                extra = min(extra, slots(st.pool.free_with(job.gpu_memory_mb), job.gpus_per_worker))
            if extra < max(1, job.workers // 4):
                continue
            why = f"grow from {job.workers} to {job.workers + extra} workers into idle GPUs"
            if job.in_place:
                # the running workers stay where they are; the new ones go where GPUs are free
                w0 = job.placement[0]
                added = st.pool.place(extra, job.gpus_per_worker, w0.cpus, w0.memory_mb, gmem=job.gpu_memory_mb)
                if added is None:
                    continue
                added = tuple(replace(w, rank=job.workers + i) for i, w in enumerate(added))
                st.out.resizes.append(Resize(job.id, job.workers + extra, why, True, added))
            else:
                trial = st.pool.copy()
                trial.release(job.placement)
                if trial.place(job.workers + extra, job.gpus_per_worker, gmem=job.gpu_memory_mb) is None:
                    continue
                st.pool = trial
                st.out.resizes.append(Resize(job.id, job.workers + extra, why))
            tenants.add(job.tenant, extra * job.gpus_per_worker)

    # starting one job ------------------------------------------------------------------
    def _start_rank(self, t: str, i: int = 0) -> tuple:
        """Tenants below their guarantee first, by the share of their entitlement in use.
        GPUs beyond a guarantee go, with the plan's ``surplus`` ``service``, to the tenant
        whose next job, ``queues[t][i]``, has the lowest service class, then the earliest
        submit time (least attained service across tenants); with ``share``, by the share
        in use, as below."""
        st = self.st
        if st.tenants.usage[t] < st.tenants.guaranteed[t]:
            return 0, st.share_used(t), 0.0, t
        q = st.queues[t]
        if st.snap.plan.surplus == "share":
            return 1, st.share_used(t), 0.0, t
        if i >= len(q):
            return 2, 0, 0.0, t
        return 1, st.waiting_class(q[i]), q[i].submitted_at, t

    def _try_start(self, t: str, job: PendingJob) -> bool:
        """Place ``job`` if it may start now; otherwise, if it is the first of its tenant
        not to start, say why it waits."""
        st = self.st
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
                self._wait(t, job, f"tenant {t} is at its max ({tenants.usage[t]:g} GPUs in use); "
                                   "it starts when the tenant's own jobs end")
            return False
        shape = (per_worker, job.gpu_memory_mb)  # gangs of this shape larger than a failed one fail too
        if job.gpu_memory_mb and 0 < need <= usable and st.failed_need.get(shape, 1 << 30) > job.min_workers:
            usable = min(usable, st.pool.free_with(job.gpu_memory_mb))  # the rest are too small for it
        if need > 0 and (need > usable or st.failed_need.get(shape, 1 << 30) <= job.min_workers):
            if is_head:
                self._wait_for_gpus(t, job, need, usable, borrowing)
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
                self._wait(t, job, pool.shortage(job.min_workers, per_worker, job.cpus_per_worker,
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

    def _wait(self, t: str, job: PendingJob, why: str) -> None:
        st = self.st
        st.reported.add(t)
        st.out.waits.append(Wait(job.id, why))

    def _wait_for_gpus(self, t: str, job: PendingJob, need: int, usable: float, borrowing: bool) -> None:
        """Not enough GPUs: the first big job that has waited long enough, and that its tenant
        deserves, gets a reservation of whole nodes while smaller jobs backfill elsewhere."""
        st = self.st
        reachable = st.capacity - (st.nonlendable if borrowing else 0)
        deserved = max(st.tenants.guaranteed[t], st.entitled.get(t, 0)) - st.tenants.usage[t]
        with_ = f" with {job.gpu_memory_mb} MiB each" if job.gpu_memory_mb else ""
        if (not st.reserved and job.gpus_per_worker and st.now - job.submitted_at >= st.cfg.reserve_after_seconds
                and need <= reachable and need <= deserved + 1e-9):
            held = _reserve(st.pool, st.snap, need, limit=int(st.avail()), gmem=job.gpu_memory_mb)
            st.reserved = True
            self._wait(t, job, f"waiting for {need} GPUs{with_}; {held} free GPUs are reserved "
                               "for it and smaller jobs backfill elsewhere")
        else:
            self._wait(t, job, f"waiting for {need} GPUs{with_} ({max(0, int(usable))} free)")


def _reserve(pool: FreePool, snap: Snapshot, need: int, limit: int, gmem: int = 0) -> int:
    """Hold the free GPUs of the nodes that will first add up to ``need``: the big job
    collects them round after round while smaller jobs backfill on the other nodes.
    At most ``limit`` GPUs: those earmarked for a reclaiming tenant are not taken. Only
    nodes whose GPUs have the job's ``gmem`` MiB each."""
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
