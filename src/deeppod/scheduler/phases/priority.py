"""Within a tenant, a higher-priority head preempts lower-priority jobs (``Config.priority_preemption``)."""

from __future__ import annotations

from deeppod.scheduler.round_state import RoundState, loss_key


def enabled(st: RoundState) -> bool:
    return st.cfg.priority_preemption


def run(st: RoundState) -> None:
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
