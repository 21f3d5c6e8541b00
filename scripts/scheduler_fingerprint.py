"""Every figure the simulator reports (JCTs, queue delays, preemptions, resizes, shares...; not
its timings) for the Philly runs of benchmarks/scheduler_philly.py, with one digest per run: a
refactoring of the policy must leave each digest as it was.

    .venv/bin/python scripts/scheduler_fingerprint.py [--jobs 100000] [--nodes 32] [--out FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from scheduler_philly import RUNS  # noqa: E402

from deeppod.scheduler.simulator import SimConfig, Simulator, load_trace, proportional_plan  # noqa: E402
from deeppod.scheduler.snapshot import Config  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(ROOT.parent / "shared" / "traces" / "philly-2017w45.csv"))
    ap.add_argument("--jobs", type=int, default=100_000, help="the trace's first this many jobs")
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--out", default=None, help="also write every figure here (JSON), to diff")
    a = ap.parse_args()
    figures = {}
    for label in ("before", "deeppod", "deeppod+elastic0.3"):
        policy, elastic, sim, cfg = RUNS[label]
        cfg = dict(cfg)
        trace = load_trace(a.trace, limit=a.jobs)
        plan = replace(proportional_plan(trace, a.nodes * 8), surplus=cfg.pop("surplus", "service"))
        r = Simulator(trace, plan, SimConfig(nodes=a.nodes, policy=policy, elastic_fraction=elastic,
                                             config=Config(**cfg), **sim)).run()
        kept = {k: v for k, v in r.items() if not any(s in k for s in ("ms", "wall", "share_samples"))}
        figures[label] = kept
        digest = hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]
        print(f"{label}: {r['jobs']} jobs, JCT {r['jct_avg_h']} h (p95 {r['jct_p95_h']}), {r['preemptions']} "
              f"preemptions, {r['resizes']} resizes; digest {digest}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(figures, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
