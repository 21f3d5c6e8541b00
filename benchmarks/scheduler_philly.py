"""DeepPod's scheduler vs FIFO vs static partitioning on the Philly week (same trace, same
plan, same simulator, one run), on the issue's cluster (64 x 8 GPUs) and on a congested one.

    python benchmarks/scheduler_philly.py [--trace ../shared/traces/philly-2017w45.csv] [--nodes 64 48]

Each tenant (virtual cluster) is guaranteed its share of the week's GPU-time. Prints the
table and the ratios; writes benchmarks/results/philly-*.json and docs/figures/philly-shares-*.png.
"""

from __future__ import annotations

import argparse
import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from deeppod.scheduler.simulator import SimConfig, Simulator, load_trace, plot_shares, proportional_plan

ROOT = Path(__file__).resolve().parents[1]
RUNS = [("fifo", 0.0), ("static", 0.0), ("deeppod", 0.0), ("deeppod", 0.3)]
COLUMNS = ["utilization_during_backlog", "backlog_hours", "jct_avg_h", "jct_p50_h", "jct_p95_h", "queue_delay_avg_h",
           "reclaim_latency_p95_s", "max_starved_h", "preemptions", "resizes", "restart_gpu_hours_lost",
           "round_ms_avg", "round_ms_max", "wall_seconds"]


def run(args) -> dict:
    trace_path, nodes, policy, elastic = args
    trace = load_trace(trace_path)
    plan = proportional_plan(trace, nodes * 8)
    r = Simulator(trace, plan, SimConfig(nodes=nodes, policy=policy, elastic_fraction=elastic)).run()
    r["label"] = policy + (f"+elastic{elastic:g}" if elastic else "")
    r["max_starved_h"] = max(r["starved_hours_by_tenant"].values())
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(ROOT.parent / "shared" / "traces" / "philly-2017w45.csv"))
    ap.add_argument("--nodes", type=int, nargs="+", default=[64, 48])
    a = ap.parse_args()
    jobs = [(a.trace, n, p, e) for n in a.nodes for p, e in RUNS]
    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        results = list(pool.map(run, jobs))
    for n in a.nodes:
        rs = [r for r in results if r["cluster"]["nodes"] == n]
        summary = [{k: v for k, v in r.items() if k != "share_samples"} for r in rs]  # the plot shows those
        (ROOT / "benchmarks" / "results" / f"philly-{n}x8.json").write_text(json.dumps(summary, indent=1))
        plot_shares([r for r in rs if r["label"] in ("fifo", "static", "deeppod")],
                    ROOT / "docs" / "figures" / f"philly-shares-{n}x8.png")
        print(f"\n## Philly week, {n} nodes x 8 GPUs = {n * 8} GPUs, {rs[0]['jobs']} jobs")
        print("| metric | " + " | ".join(r["label"] for r in rs) + " |")
        print("|---|" + "---|" * len(rs))
        for c in COLUMNS:
            print(f"| {c} | " + " | ".join(str(r[c]) for r in rs) + " |")
        by = {r["label"]: r for r in rs}
        d = by["deeppod"]
        for base in ("fifo", "static"):
            b = by[base]
            print(f"ratio avg JCT {base}/deeppod: {b['jct_avg_h'] / d['jct_avg_h']:.2f}x; "
                  f"p95 reclaim latency {base}/deeppod: {b['reclaim_latency_p95_s'] / max(d['reclaim_latency_p95_s'], 1):.0f}x")
        de = by["deeppod+elastic0.3"]
        print(f"ratio avg JCT fifo/deeppod+elastic0.3: {by['fifo']['jct_avg_h'] / de['jct_avg_h']:.2f}x")


if __name__ == "__main__":
    main()
