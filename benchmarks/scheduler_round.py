"""One scheduling round at scale: 10,000 queued jobs on 1,024 GPUs (128 nodes x 8).

Measures DeepPod's full policy (plan, reclaim, fair share, reservations, elastic) next to
the FIFO baseline on the same snapshot, and prints the ratio. Aim: <= 50 ms a round.

    python benchmarks/scheduler_round.py [--queued 10000] [--nodes 128] [--repeat 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
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
