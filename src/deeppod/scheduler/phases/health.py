"""Jobs on unhealthy nodes or GPUs are preempted; they requeue and avoid them."""

from __future__ import annotations

from deeppod.scheduler.round_state import RoundState
from deeppod.scheduler.snapshot import Preempt


def run(st: RoundState) -> None:
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
