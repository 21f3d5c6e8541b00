"""Training throughput: DeepPod's runtime loop (job contract, runtime.init, report() every
step, should_stop polling) vs the same loop in bare PyTorch under torchrun, side by side,
plus scaling 1 -> N workers and the cost of a checkpoint save. Aim: ratio >= 0.98.

    python benchmarks/train_throughput.py [--model resnet50] [--batch-size 8] [--image-size 224]
                                          [--workers 2] [--steps 10] [--rounds 2]

On a GPU machine use e.g. --batch-size 64 --workers <GPUs>: AMP and channels_last are on there.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from deeppod.bench.train import run_workers, summarize

ROOT = Path(__file__).resolve().parents[1]


def bare(workers: int, args: list[str], threads: int) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={workers}",
                        str(ROOT / "benchmarks" / "bare_train.py"), *args], env=env, capture_output=True, text=True,
                       timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(p.stdout[-2000:] + p.stderr[-2000:])
    # each rank's figure, wherever another rank's output cut into its line
    return sum(json.loads(m)["images_per_second"] for m in re.findall(r"DEEPPOD-BENCH (\{[^{}]*\})", p.stdout))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch-size", type=int, default=8, help="per worker")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2, help="alternate the two this many times; medians reported")
    a = ap.parse_args()
    threads = max(1, (os.cpu_count() or 1) // a.workers)
    args = ["--model", a.model, "--batch-size", str(a.batch_size), "--image-size", str(a.image_size),
            "--steps", str(a.steps)]
    ours, theirs, ckpt, one = [], [], {}, []
    for _ in range(a.rounds):
        theirs.append(bare(a.workers, args, threads))
        s = summarize(run_workers(a.workers, args + ["--checkpoint"], threads_per_worker=threads))
        ours.append(s["images_per_second_total"])
        ckpt = s
        one.append(summarize(run_workers(1, args, threads_per_worker=threads))["images_per_second_total"])
    o, t, single = statistics.median(ours), statistics.median(theirs), statistics.median(one)
    print(f"model {a.model}, {a.batch_size} images/worker/step, {a.image_size}px, {a.workers} workers, "
          f"{a.steps} timed steps, {a.rounds} rounds each")
    print(f"bare PyTorch + torchrun : {t:8.2f} images/s  (runs: {', '.join(f'{x:.2f}' for x in theirs)})")
    print(f"DeepPod runtime         : {o:8.2f} images/s  (runs: {', '.join(f'{x:.2f}' for x in ours)})")
    per_round = [ours[i] / theirs[i] for i in range(a.rounds)]
    print(f"ratio DeepPod / bare    : {o / t:.3f} of the medians; per round {', '.join(f'{r:.3f}' for r in per_round)} "
          f"(median {statistics.median(per_round):.3f}, worst {min(per_round):.3f}; aim >= 0.98 in the worst round)")
    print(f"1 worker (DeepPod)      : {single:8.2f} images/s; scaling efficiency 1 -> {a.workers}: "
          f"{o / (a.workers * single):.0%}")
    print(f"checkpoint save         : {ckpt['checkpoint_bytes'] / 1e6:.0f} MB, {ckpt['checkpoint_blocking_s']:.2f} s "
          f"blocking, {ckpt['checkpoint_background_stall_s'] * 1000:.0f} ms loop stall with background=True")


if __name__ == "__main__":
    main()
