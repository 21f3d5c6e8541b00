"""Gang placement: all workers at once or none, packed on the fewest nodes."""

from __future__ import annotations

from dataclasses import replace

from deeppod.scheduler.snapshot import NodeState, PendingJob, WorkerPlacement


def _fits(node: NodeState, job: PendingJob) -> int:
    """How many of the job's workers this node can hold."""
    if not node.healthy:
        return 0
    limits = []
    if job.gpus_per_worker:
        limits.append(len(node.free_gpus) // job.gpus_per_worker)
    if job.cpus_per_worker:
        limits.append(int(node.free_cpus // job.cpus_per_worker + 1e-9))
    if job.memory_mb_per_worker:
        limits.append(node.free_memory_mb // job.memory_mb_per_worker)
    return min(limits) if limits else job.workers


def place(job: PendingJob, nodes: tuple[NodeState, ...]) -> tuple[tuple[WorkerPlacement, ...], tuple[NodeState, ...]] | None:
    """Place every worker of ``job`` or return None. Returns the placement (ranks ordered
    node by node, like ddlrun's rankfile) and the nodes with the placement taken out."""
    room = {n.name: _fits(n, job) for n in nodes}
    if sum(room.values()) < job.workers:
        return None
    # Best fit on one node if possible (leaves big holes for big jobs); else fill the
    # roomiest nodes first so the job spans as few nodes as it can.
    single = [n for n in nodes if room[n.name] >= job.workers]
    if single:
        chosen = [min(single, key=lambda n: (room[n.name], len(n.free_gpus), n.name))]
    else:
        chosen = sorted(nodes, key=lambda n: (-room[n.name], n.name))
    placement: list[WorkerPlacement] = []
    updated = {n.name: n for n in nodes}
    for node in chosen:
        take = min(room[node.name], job.workers - len(placement))
        free = list(node.free_gpus)
        for _ in range(take):
            gpus = tuple(free[: job.gpus_per_worker])
            del free[: job.gpus_per_worker]
            placement.append(WorkerPlacement(len(placement), node.name, gpus,
                                             job.cpus_per_worker, job.memory_mb_per_worker))
        updated[node.name] = replace(
            node,
            free_gpus=tuple(free),
            free_cpus=node.free_cpus - take * job.cpus_per_worker,
            free_memory_mb=node.free_memory_mb - take * job.memory_mb_per_worker,
        )
        if len(placement) == job.workers:
            break
    return tuple(placement), tuple(updated[n.name] for n in nodes)
