"""Least attained service (Tiresias; ``Config.las_preemption``): a waiting job of a lower
service class takes GPUs from jobs of a higher class of its own tenant (with
``las_across_tenants``, also from jobs that borrow, while its tenant is within its share and
never below the donor's guarantee). Highest class and most service first; an elastic victim
is shrunk rather than stopped where that is enough; a run younger than
``min_run_before_las_preempt`` is left alone. Tenants are taken neediest first; room is made
for the tenant's waiting jobs of the head's class together (``las_jobs_per_round``), the head
at least."""

from __future__ import annotations

import math
from collections import defaultdict

from deeppod.scheduler.phases.starts import start_rank
from deeppod.scheduler.queue_order import service_class
from deeppod.scheduler.round_state import RoundState, slots
from deeppod.scheduler.snapshot import RunningJob, attained_at


def enabled(st: RoundState) -> bool:
    return st.cfg.las_preemption and bool(st.cfg.las_thresholds)


def run(st: RoundState) -> None:
    tenants, cfg = st.tenants, st.cfg
    needs, blocked = _blocked(st)
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
        need = needs[t] if t in needs else _need(st, t)
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


def _blocked(st: RoundState) -> tuple[dict[str, int], dict[str, tuple]]:
    """The tenants least attained service is for, with their start ranks: those the GPUs for
    their head and the jobs of its class behind it (``_need``) are not there for. Where even
    the head's are not, a tenant is blocked without counting the rest (most tenants, most
    rounds); the needs counted are returned too."""
    needs: dict[str, int] = {}
    blocked: dict[str, tuple] = {}
    avail = st.avail()
    for t, q in st.queues.items():
        head_need = q[0].min_workers * q[0].gpus_per_worker
        if head_need <= 0:
            continue  # no GPUs asked, nothing to take (and then no jobs behind it count)
        if head_need <= avail + st.held_for[t]:
            needs[t] = _need(st, t)
            if needs[t] <= avail + st.held_for[t]:
                continue
        blocked[t] = start_rank(st, t)
    return needs, blocked


def _need(st: RoundState, t: str) -> int:
    """GPUs for tenant ``t``'s head and the 1-GPU-per-worker jobs right behind it in the same
    priority and class (up to ``las_jobs_per_round`` jobs)."""
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
