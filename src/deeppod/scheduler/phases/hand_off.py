"""The cluster's own scheduler decides (``deeppod server --executor slurm``): every waiting job
the plan lets its tenant run is handed to it at once, in each tenant's queue order; it queues,
places and starts them. DeepPod keeps its plan's word on how many GPUs a tenant may hold (its
``max``); where the workers run is the cluster's to pick (``ELSEWHERE``: no node of DeepPod's)."""

from __future__ import annotations

from deeppod.scheduler.round_state import RoundState
from deeppod.scheduler.snapshot import Start, Wait, WorkerPlacement

ELSEWHERE = "(slurm)"  # not a host name: no node of the inventory is called so


def run(st: RoundState) -> None:
    for t, queue in st.queues.items():
        for job in queue:
            need = job.min_workers * job.gpus_per_worker
            if need > st.tenants.cap_room(t):  # the rest of its queue waits behind it, in order
                st.out.waits.append(Wait(job.id, f"tenant {t} is at its max ({st.tenants.usage[t]:g} GPUs in use); it "
                                                 "goes to the cluster's queue when the tenant's own jobs end"))
                break
            st.tenants.add(t, need)
            placement = tuple(WorkerPlacement(rank, ELSEWHERE, tuple(range(job.gpus_per_worker)),
                                              job.cpus_per_worker, job.memory_mb_per_worker)
                              for rank in range(job.min_workers))
            st.out.starts.append(Start(job.id, placement, "handed to the cluster's scheduler"))
