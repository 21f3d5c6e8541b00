"""How low can the average JCT go on a Philly week? Idealized policies next to FIFO.

    python benchmarks/scheduler_bound.py [--trace ../shared/traces/philly-2017w45.csv]
        [--week 2017-W41] [--gpus 256 384 512]

The idealized policies see the cluster as one pool of GPUs (no nodes, so no gang has to
wait for whole nodes) and preempt for free (no stop delay, no restart): every time a job
arrives or ends, the running set is chosen again from scratch.

- ``las``: least attained service across the whole cluster (Tiresias's classes, the same
  thresholds as DeepPod's, then arrival), no guarantees: a lower bound for any
  non-clairvoyant policy that ignores tenants;
- ``las+guarantees``: each tenant's jobs, in that order, first up to its guarantee; the
  rest of the cluster in the same order across tenants: what DeepPod's policy aims at,
  without its costs;
- ``srpt``: shortest remaining time first, knowing every run time (clairvoyant).

Prints each one's average JCT and its ratio to FIFO's from DeepPod's simulator (the same
FIFO the Philly benchmark reports), the mean run time, under which no policy can go, and
DeepPod's own policy in the same simulator (``deeppod``, no elastic jobs), with its distance
to the idealized policy that keeps the guarantees (``las+guarantees``) and to the clairvoyant
one (``srpt``): how far the real policy is from the best possible, not only from FIFO.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

from deeppod.scheduler.policy import service_class
from deeppod.scheduler.simulator import SimConfig, Simulator, TraceJob, load_trace, proportional_plan
from deeppod.scheduler.snapshot import Config

ROOT = Path(__file__).resolve().parents[1]
THRESHOLDS = Config().las_thresholds


def idealized(trace: list[TraceJob], gpus: int, order: str, guaranteed: dict[str, int]) -> float:
    """Average JCT (seconds) of an idealized policy on one pool of ``gpus``."""
    jobs = {j.id: j for j in trace if j.gpus <= gpus}
    arrivals = sorted(jobs.values(), key=lambda j: j.arrival)
    left: dict[int, float] = {}  # job id -> run time still to go
    end: dict[int, float] = {}
    now, i = 0.0, 0

    def key(jid: int):
        j = jobs[jid]
        if order == "srpt":
            return left[jid], jid
        return service_class((j.duration - left[jid]) * j.gpus, THRESHOLDS), j.arrival, jid

    while i < len(arrivals) or left:
        ranked = sorted(left, key=key)
        free, running = gpus, []
        if order == "las+guarantees":
            used: dict[str, int] = defaultdict(int)
            for jid in ranked:
                j = jobs[jid]
                if used[j.tenant] + j.gpus <= guaranteed.get(j.tenant, 0) and j.gpus <= free:
                    used[j.tenant] += j.gpus
                    free -= j.gpus
                    running.append(jid)
            chosen = set(running)
            ranked = [jid for jid in ranked if jid not in chosen]
        for jid in ranked:
            if jobs[jid].gpus <= free:
                free -= jobs[jid].gpus
                running.append(jid)
        t = min(arrivals[i].arrival if i < len(arrivals) else float("inf"),
                min((now + left[jid] for jid in running), default=float("inf")))
        for jid in running:
            left[jid] -= t - now
            if left[jid] <= 1e-6:
                del left[jid]
                end[jid] = t
        now = t
        while i < len(arrivals) and arrivals[i].arrival <= now:
            left[arrivals[i].id] = arrivals[i].duration
            i += 1
    return statistics.fmean(end[j.id] - j.arrival for j in jobs.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(ROOT.parent / "shared" / "traces" / "philly-2017w45.csv"))
    ap.add_argument("--week", default=None, help="keep one ISO week of the trace, e.g. 2017-W41")
    ap.add_argument("--gpus", type=int, nargs="+", default=[256, 384, 512])
    a = ap.parse_args()
    trace = load_trace(a.trace, week=a.week)
    print("| GPUs | FIFO (simulator) | deeppod (simulator) | las | las+guarantees | srpt | mean run time "
          "| deeppod / las+guarantees | deeppod / srpt |")
    print("|---|---|---|---|---|---|---|---|---|")
    for gpus in a.gpus:
        sim = Simulator(trace, proportional_plan(trace, gpus), SimConfig(nodes=gpus // 8, policy="fifo"))
        g = sim.g  # each tenant's guarantee, as the simulator reads it from the plan
        fifo = sim.run()["jct_avg_h"]
        ours = Simulator(trace, proportional_plan(trace, gpus), SimConfig(nodes=gpus // 8)).run()["jct_avg_h"]
        cells, hours = [], {}
        for order in ("las", "las+guarantees", "srpt"):
            h = hours[order] = idealized(trace, gpus, order, g) / 3600
            cells.append(f"{h:.2f} ({h / fifo:.2f}x)")
        run = statistics.fmean(j.duration for j in trace if j.gpus <= gpus) / 3600
        print(f"| {gpus} | {fifo:.2f} | {ours:.2f} ({ours / fifo:.2f}x) | {' | '.join(cells)} "
              f"| {run:.2f} ({run / fifo:.2f}x) | {ours / hours['las+guarantees']:.2f}x "
              f"| {ours / hours['srpt']:.2f}x |",
              flush=True)


if __name__ == "__main__":
    main()
