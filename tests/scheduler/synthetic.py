"""Synthetic clusters for the scheduler at scale: a snapshot of ``nodes`` x 8 GPUs about 90%
busy (15 tenants with guarantees and weights, 30% of jobs elastic, sizes from 1 to 16 GPUs)
and ``queued`` jobs waiting. Deterministic for a seed: benchmarks/scheduler_round.py times
rounds on it and tests/scheduler/test_scale.py checks the decisions made on it."""

from __future__ import annotations

import random

from deeppod.scheduler import Config, NodeState, PendingJob, Plan, PlanNode, RunningJob, Snapshot, WorkerPlacement


def build(queued: int, nodes: int, gpus_per_node: int = 8, tenants: int = 15, seed: int = 0,
          busy: float = 0.9) -> Snapshot:
    rng = random.Random(seed)
    names = [f"t{i}" for i in range(tenants)]
    total = nodes * gpus_per_node
    plan = Plan(tuple(PlanNode(n, guaranteed=total // tenants, weight=rng.choice([1.0, 2.0])) for n in names))
    free = {i: list(range(gpus_per_node)) for i in range(nodes)}
    running, jid, used = [], 10**6, 0
    sizes = [1] * 80 + [2] * 6 + [4] * 6 + [8] * 6 + [16] * 2
    while used < busy * total:
        size = rng.choice(sizes)
        gpw = min(size, gpus_per_node)
        workers = size // gpw
        placement = []
        for i in rng.sample(range(nodes), nodes):
            while len(free[i]) >= gpw and len(placement) < workers:
                g = tuple(free[i][:gpw])
                del free[i][:gpw]
                placement.append(WorkerPlacement(len(placement), f"n{i}", g, 1.0, 0))
            if len(placement) == workers:
                break
        if len(placement) < workers:
            for w in placement:  # does not fit any more: give back and try a smaller job
                free[int(w.node[1:])].extend(w.gpus)
            sizes = [x for x in sizes if x < size] or [0]
            if sizes == [0]:
                break
            continue
        jid += 1
        used += size
        elastic = rng.random() < 0.3
        running.append(RunningJob(jid, rng.choice(names), tuple(placement), gpw, max(1,
                                                                                     workers // 2) if elastic
                                  else workers,
                                  workers * 2 if elastic else workers, 0, True, rng.uniform(0, 3000),
                                  rng.uniform(0, 3000)))
    node_states = tuple(NodeState(f"n{i}", tuple(free[i]), 64.0, 1 << 20, True, gpus_per_node) for i in range(nodes))
    q = []
    for i in range(queued):
        size = rng.choice(sizes)
        gpw = min(size, gpus_per_node)
        q.append(PendingJob(i, rng.choice(names), size // gpw, gpw, 1.0, 0, rng.choice([0, 0, 0, 1, 5]),
                            rng.uniform(0, 3600), max_workers=(size // gpw) * 2 if rng.random() < 0.3 else None))
    return Snapshot(node_states, tuple(q), tuple(running), plan, 3600.0, Config())
