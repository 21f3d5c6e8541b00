"""One scheduling round at scale: 10,000 queued jobs on 1,024 GPUs (128 nodes x 8).

Measures DeepPod's full policy (plan, reclaim, fair share, reservations, elastic) next to
the FIFO baseline on the same snapshot, and prints the ratio. Aims: <= 40 ms a round at
1,024 GPUs, <= 100 ms at 10,000 (--nodes 1250).

    python benchmarks/scheduler_round.py [--queued 10000] [--nodes 128] [--repeat 20]
    python benchmarks/scheduler_round.py --sweep   # 128 to 2,500 nodes, 8 queued jobs a node
    python benchmarks/scheduler_round.py --gpu-memory   # the same snapshot with GPU memory requests too

The sweep grows the cluster and its queue together (n = queued + running jobs) and prints
each round's time next to what n log n growth from the smallest size would allow.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deeppod.scheduler import schedule  # noqa: E402
from deeppod.scheduler.baselines import fifo  # noqa: E402
from tests.scheduler.synthetic import build  # noqa: E402


def timeit(fn, snap, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(snap)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), max(times)


def sweep(sizes: list[int], repeat: int) -> None:
    print(f"{'nodes':>6} {'GPUs':>6} {'queued':>7} {'running':>8} {'deeppod ms':>11} {'fifo ms':>8} "
          f"{'x fifo':>7} {'x smallest':>11} {'n log n allows':>15}")
    base = None
    for nodes in sizes:
        snap = build(8 * nodes, nodes)
        schedule(snap)
        med, _ = timeit(schedule, snap, repeat)
        fmed, _ = timeit(fifo, snap, repeat)
        n = len(snap.queued) + len(snap.running)
        base = base or (med, n)
        allows = n * math.log(n) / (base[1] * math.log(base[1]))
        print(f"{nodes:>6} {nodes * 8:>6} {len(snap.queued):>7} {len(snap.running):>8} {med:>11.1f} {fmed:>8.1f} "
              f"{med / fmed:>7.2f} {med / base[0]:>11.2f} {allows:>15.2f}")


def with_gpu_memory(snap):
    """The snapshot on a cluster of two GPU sizes (every other node 80 GiB, the rest 40 GiB),
    where every other waiting job asks for 60 GiB GPUs: they fit half the nodes."""
    nodes = tuple(replace(n, gpu_memory_mb=81920 if i % 2 else 40960) for i, n in enumerate(snap.nodes))
    queued = tuple(replace(j, gpu_memory_mb=61440) if i % 2 else j for i, j in enumerate(snap.queued))
    return replace(snap, nodes=nodes, queued=queued)


def gpu_memory(snap, repeat: int) -> None:
    """The round on the snapshot as built and with GPU memory requests, interleaved."""
    mixed = with_gpu_memory(snap)
    plain_t, mixed_t = [], []
    for _ in range(repeat):
        plain_t.append(timeit(schedule, snap, 1)[0])
        mixed_t.append(timeit(schedule, mixed, 1)[0])
    d = schedule(mixed)
    at = {n.name: n.gpu_memory_mb for n in mixed.nodes}
    asks = {j.id: j.gpu_memory_mb for j in mixed.queued}
    wrong = [s.job_id for s in d.starts if any(at[w.node] < asks.get(s.job_id, 0) for w in s.placement)]
    pm, mm = statistics.median(plain_t), statistics.median(mixed_t)
    print(f"round, no GPU memory asked: median {pm:.1f} ms; with half the jobs asking 60 GiB GPUs on a 40/80 GiB "
          f"cluster: median {mm:.1f} ms ({mm / pm:.2f}x); {len(d.starts)} starts, {len(wrong)} on GPUs too small")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queued", type=int, default=10_000)
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--sweep", nargs="?", const="128,256,512,1250,2500", default=None, metavar="NODES",
                    help="round time at these cluster sizes (8 queued jobs a node)")
    ap.add_argument("--gpu-memory", action="store_true",
                    help="also time the round with GPU memory requests on a cluster of two GPU sizes")
    a = ap.parse_args()
    if a.sweep:
        sweep([int(x) for x in a.sweep.split(",")], min(a.repeat, 5))
        return
    snap = build(a.queued, a.nodes)
    d = schedule(snap)
    med, worst = timeit(schedule, snap, a.repeat)
    fmed, fworst = timeit(fifo, snap, a.repeat)
    print(f"snapshot: {a.queued} queued, {len(snap.running)} running, {a.nodes * 8} GPUs "
          f"({sum(len(n.free_gpus) for n in snap.nodes)} free)")
    print(f"decisions: {len(d.starts)} starts, {len(d.preempts)} preempts, {len(d.resizes)} resizes, {len(d.waits)} "
          f"waits")
    print(f"deeppod round: median {med:.1f} ms, max {worst:.1f} ms  (aim <= 40 ms at 1,024 GPUs, <= 100 ms at 10,000)")
    print(f"fifo round:    median {fmed:.1f} ms, max {fworst:.1f} ms")
    print(f"ratio deeppod/fifo: {med / fmed:.2f}x the time of a policy that does no sharing at all")
    if a.gpu_memory:
        gpu_memory(snap, a.repeat)


if __name__ == "__main__":
    main()
