"""One scheduling round at scale: 10,000 queued jobs on 1,024 GPUs (128 nodes x 8).

Measures DeepPod's full policy (plan, reclaim, fair share, reservations, elastic) next to
the FIFO baseline on the same snapshot, and prints the ratio. Aim: <= 50 ms a round.

    python benchmarks/scheduler_round.py [--queued 10000] [--nodes 128] [--repeat 20]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from deeppod.scheduler import (Config, NodeState, PendingJob, Plan, PlanNode, RunningJob, Snapshot,
                               WorkerPlacement, schedule)
from deeppod.scheduler.baselines import fifo


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
        running.append(RunningJob(jid, rng.choice(names), tuple(placement), gpw, max(1, workers // 2) if elastic else workers,
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


def timeit(fn, snap, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(snap)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), max(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queued", type=int, default=10_000)
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args()
    snap = build(a.queued, a.nodes)
    d = schedule(snap)
    med, worst = timeit(schedule, snap, a.repeat)
    fmed, fworst = timeit(fifo, snap, a.repeat)
    print(f"snapshot: {a.queued} queued, {len(snap.running)} running, {a.nodes * 8} GPUs "
          f"({sum(len(n.free_gpus) for n in snap.nodes)} free)")
    print(f"decisions: {len(d.starts)} starts, {len(d.preempts)} preempts, {len(d.resizes)} resizes, {len(d.waits)} waits")
    print(f"deeppod round: median {med:.1f} ms, max {worst:.1f} ms  (aim <= 50 ms)")
    print(f"fifo round:    median {fmed:.1f} ms, max {fworst:.1f} ms")
    print(f"ratio deeppod/fifo: {med / fmed:.2f}x the time of a policy that does no sharing at all")


if __name__ == "__main__":
    main()
