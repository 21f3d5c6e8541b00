"""Guarantee reclaim, neediest tenant first: a tenant below its guarantee with waiting work
gets GPUs back from tenants above theirs, by shrinks, then preemptions (preempt.py).

Per tenant, the jobs that fit in what is left of its guarantee are tried in queue order
(bigger ones may borrow, not reclaim); where the first cannot be served (no node can be
cleared for it), the next size is, so one stuck gang does not hold the whole tenant. One
eviction per tenant per round (docs/benchmarks.md: all at once doubled the preemptions);
free GPUs earmarked for as many jobs as fit preempt nothing and do not count as it."""

from __future__ import annotations

from deeppod.scheduler.preempt import Preemption
from deeppod.scheduler.round_state import RoundState
from deeppod.scheduler.snapshot import Wait


def run(st: RoundState) -> None:
    tenants = st.tenants
    preempt = Preemption(st)
    reclaiming = sorted((t for t in st.queues if tenants.usage[t] < tenants.guaranteed[t]),
                        key=lambda t: (tenants.usage[t] / max(tenants.guaranteed[t], 1e-9), t))
    for t in reclaiming:
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
            if preempt.take_back(t, head, tenants.above_guarantee, True, why):
                st.reclaim_for.setdefault(t, set()).add(head.id)
                break
            if len(tried) == 1:
                st.out.waits.append(Wait(head.id, f"tenant {t} is below its guarantee; no jobs can be "
                                                    "preempted to make room for this gang yet"))
            if len(tried) >= 3:
                break
