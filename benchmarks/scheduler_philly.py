"""DeepPod's scheduler vs FIFO, vs DeepPod's policy before least-attained-service ordering,
and vs static partitioning, on Philly weeks (same trace, same plan, same simulator, one run)
on 256, 384 and 512 GPUs.

    python benchmarks/scheduler_philly.py [--trace ../shared/traces/philly-2017w45.csv]
        [--week 2017-W41] [--nodes 32 48 64] [--tag w45]

``--trace`` may be the whole public Philly log (msr-fiddle/philly-traces, in the processed
form petuum/adaptdl publishes as simulator/traces/philly.csv); ``--week`` then keeps one ISO
week of it. Each tenant (virtual cluster) is guaranteed its share of the week's GPU-time.
Runs:

- ``fifo``: one queue, arrival order, no preemption;
- ``before``: DeepPod's policy as it was (tenants' guarantees, reclaim, backfill; each
  tenant's jobs in arrival order; the surplus by weighted share; a resize is a checkpoint
  restart);
- ``deeppod``: today's policy (least attained service within each tenant and, on GPUs
  beyond the guarantees, across tenants: the plan's ``surplus: service``);
- ``deeppod+elastic0.3``: the same with 30% of jobs elastic, resized in place;
- ``before+elastic0.3``: the policy as it was on that same workload (its elastic jobs
  resized by restart): the baseline for the elastic row's guarantee and JCT figures;
- ``static``: hard partitions, one per tenant.

Prints the table and the ratios; writes benchmarks/results/philly-TAG-NODESx8.json and
docs/figures/philly-shares-TAG-NODESx8.png. With ``--runs`` naming some of the runs, only
their rows of an existing results file are replaced (the simulator is deterministic: the
same code and trace give the same figures).
"""

from __future__ import annotations

import argparse
import json
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from deeppod.scheduler.simulator import SimConfig, Simulator, load_trace, plot_shares, proportional_plan
from deeppod.scheduler.snapshot import Config

ROOT = Path(__file__).resolve().parents[1]
# the policy as it was before least attained service (issue 17), resizes by restart
BEFORE = {"las_thresholds": (), "defragment": False, "earmark_free": False, "las_across_tenants": False,
          "surplus": "share"}
RUNS = {  # label: (policy, elastic fraction, simulator settings, policy settings)
    "fifo": ("fifo", 0.0, {}, {}),
    "before": ("deeppod", 0.0, {"in_place": False}, BEFORE),
    "deeppod": ("deeppod", 0.0, {}, {}),
    "deeppod+elastic0.3": ("deeppod", 0.3, {}, {}),
    "before+elastic0.3": ("deeppod", 0.3, {"in_place": False}, BEFORE),
    "static": ("static", 0.0, {}, {}),
}
COLUMNS = ["utilization_during_backlog", "backlog_hours", "jct_avg_h", "jct_p50_h", "jct_p95_h", "queue_delay_avg_h",
           "reclaim_latency_p95_s", "max_starved_h", "preemptions", "resizes", "in_place_resizes",
           "restart_gpu_hours_lost", "round_ms_avg", "round_ms_max", "wall_seconds"]


def run(args) -> dict:
    trace_path, week, nodes, label = args
    policy, elastic, sim, cfg = RUNS[label]
    cfg = dict(cfg)
    trace = load_trace(trace_path, week=week)
    plan = replace(proportional_plan(trace, nodes * 8), surplus=cfg.pop("surplus", "service"))
    r = Simulator(trace, plan, SimConfig(nodes=nodes, policy=policy, elastic_fraction=elastic, config=Config(**cfg),
                                         **sim)).run()
    r["label"] = label
    r["max_starved_h"] = max(r["starved_hours_by_tenant"].values())
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(ROOT.parent / "shared" / "traces" / "philly-2017w45.csv"))
    ap.add_argument("--week", default=None, help="keep one ISO week of the trace, e.g. 2017-W41")
    ap.add_argument("--nodes", type=int, nargs="+", default=[32, 48, 64])
    ap.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    ap.add_argument("--tag", default=None, help="names the results (default: the week, or the trace's name)")
    a = ap.parse_args()
    tag = a.tag or (a.week.lower().replace("-", "") if a.week else Path(a.trace).stem.replace("philly-", ""))
    jobs = [(a.trace, a.week, n, label) for n in a.nodes for label in a.runs]
    # the slowest (most congested, most rounds) first, so that two cores stay busy to the end
    jobs.sort(key=lambda j: (j[2], j[3] == "fifo"))
    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        results = list(pool.map(run, jobs))
    for n in a.nodes:
        out = ROOT / "benchmarks" / "results" / f"philly-{tag}-{n}x8.json"
        new = [r for r in results if r["cluster"]["nodes"] == n]
        kept = [r for r in (json.loads(out.read_text()) if out.exists() else [])
                if r["label"] in RUNS and r["label"] not in a.runs]
        rs = sorted(new + kept, key=lambda r: list(RUNS).index(r["label"]))
        summary = [{k: v for k, v in r.items() if k != "share_samples"} for r in rs]  # the plot shows those
        out.write_text(json.dumps(summary, indent=1))
        shown = [r for r in new if r["label"] in ("fifo", "before", "deeppod")]
        if len(shown) == 3:
            plot_shares(shown, ROOT / "docs" / "figures" / f"philly-shares-{tag}-{n}x8.png")
        print(f"\n## Philly {a.week or tag}, {n} nodes x 8 GPUs = {n * 8} GPUs, {rs[0]['jobs']} jobs")
        print("| metric | " + " | ".join(r["label"] for r in rs) + " |")
        print("|---|" + "---|" * len(rs))
        for c in COLUMNS:
            print(f"| {c} | " + " | ".join(str(r[c]) for r in rs) + " |")
        by = {r["label"]: r for r in rs}
        for label, before in (("deeppod", "before"), ("deeppod+elastic0.3", "before+elastic0.3")):
            d = by.get(label)
            for base in ("fifo", before):
                b = by.get(base)
                if d and b:
                    print(f"ratio average JCT {label}/{base}: {d['jct_avg_h'] / b['jct_avg_h']:.2f}x "
                          f"(p50 {d['jct_p50_h'] / max(b['jct_p50_h'], 1e-9):.2f}x, "
                          f"p95 {d['jct_p95_h'] / max(b['jct_p95_h'], 1e-9):.2f}x)")


if __name__ == "__main__":
    main()
