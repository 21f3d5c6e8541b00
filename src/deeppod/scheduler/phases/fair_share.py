"""Fair-share contention: a tenant below its weighted fair share shrinks (never preempts)
elastic jobs of tenants above theirs."""

from __future__ import annotations

from deeppod.scheduler.preempt import Preemption
from deeppod.scheduler.round_state import RoundState


def run(st: RoundState) -> None:
    tenants = st.tenants
    preempt = Preemption(st)
    for t in sorted(st.queues, key=lambda t: (st.share_used(t), t)):
        head = st.queues[t][0]
        need = head.min_workers * head.gpus_per_worker
        if need == 0 or st.held_for[t] >= need or tenants.usage[t] + need > st.entitled.get(t, 0) + 1e-9:
            continue
        if st.avail_for(head) + st.held_for[t] >= need:
            continue
        preempt.take_back(t, head, lambda v: min(tenants.usage[v] - st.entitled.get(v, 0),
                                                 tenants.above_guarantee(v)),
                          False, f"fair share for tenant {t}: job {head.id} waits and it is below its share")
