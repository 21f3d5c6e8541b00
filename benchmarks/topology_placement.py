"""Topology-aware placement against packing by node (issue 44): on a simulated cluster of
8-GPU nodes, half NVSwitch and half PCIe boxes (two sockets, two PCIe switches each), with a
quarter of the PCIe half DGX-1-like hybrid cube-meshes, jobs of 1, 2 and 4 GPUs arrive and
leave; each is placed by the scheduler's own ``FreePool`` with the nodes' topologies (DeepPod)
or without them (the first free GPUs of the chosen node: packing by node). For every
multi-GPU job it records whether its GPUs were the tightest set the node had free at that
moment, and whether they crossed a socket.

    python benchmarks/topology_placement.py [--nodes 64] [--jobs 20000] [--seeds 1 2 3]

Each seed is a round: both placements see the same arrivals. The share placed on their
tightest available set is printed per round with the median and the worst round.
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
from itertools import combinations
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


def simulate(nodes: int, jobs: int, seed: int, aware: bool) -> dict:
    from deeppod.scheduler.pool import FreePool
    from deeppod.scheduler.snapshot import NodeState
    from deeppod.scheduler.topology import SYS, dgx1, nvswitch8, pcie_box

    kinds = [nvswitch8() if i % 2 == 0 else (dgx1() if i % 8 == 1 else pcie_box()) for i in range(nodes)]
    state = tuple(NodeState(f"n{i}", tuple(range(8)), 64.0, 1 << 20, topology=kinds[i] if aware else None)
                  for i in range(nodes))
    pool = FreePool(state)
    rng = random.Random(seed)
    now, leaving, placed, tight, crossed, waited = 0.0, [], 0, 0, 0, 0
    for _ in range(jobs):
        now += rng.expovariate(nodes * 8 / 6.0)  # offered load about 6 GPU-units per node's 8: busy, not full
        while leaving and leaving[0][0] <= now:
            _, node, gpus = heapq.heappop(leaving)
            pool.give(node, gpus, 0, 0)
        k = rng.choice((1, 1, 2, 2, 4))
        before = {name: list(pool.free[i]) for i, name in enumerate(pool.names)}
        got = pool.place(1, k)
        if got is None:
            waited += 1
            continue
        w = got[0]
        heapq.heappush(leaving, (now + rng.expovariate(1.0) * 4, w.node, w.gpus))
        if k < 2:
            continue
        topo = kinds[pool.index[w.node]]
        best = min(topo.span(c) for c in combinations(before[w.node], k))
        placed += 1
        tight += topo.span(w.gpus) == best
        crossed += topo.span(w.gpus) == SYS
    return {"placed": placed, "tight": tight / max(1, placed), "crossed": crossed / max(1, placed), "waited": waited}


def main() -> None:
    from deeppod.bench.spread import LoadMeter, Spread, machine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    args = ap.parse_args()
    print(machine())
    meter = LoadMeter()
    ours, theirs = [], []
    for seed in args.seeds:
        a = simulate(args.nodes, args.jobs, seed, aware=True)
        b = simulate(args.nodes, args.jobs, seed, aware=False)
        ours.append(a)
        theirs.append(b)
        print(f"seed {seed}: multi-GPU jobs on their tightest free set: DeepPod {a['tight']:.1%} "
              f"(across sockets {a['crossed']:.1%}), packing by node {b['tight']:.1%} (across sockets "
              f"{b['crossed']:.1%}); {a['placed']:,} / {b['placed']:,} placed, {a['waited']:,} / {b['waited']:,} "
              "waited", flush=True)
    print(Spread.of([a["tight"] for a in ours]).line("DeepPod, share on the tightest set").replace("x (", " ("))
    print(Spread.of([b["tight"] for b in theirs]).line("packing by node, share on the tightest set")
          .replace("x (", " ("))
    print(Spread.of([b["crossed"] / max(1e-9, a["crossed"]) if a["crossed"] else float("inf")
                     for a, b in zip(ours, theirs)]).line("jobs across sockets, packing by node / DeepPod"))
    print(meter.line())


if __name__ == "__main__":
    main()
