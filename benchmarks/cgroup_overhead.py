"""What the kernel's limits cost a sandboxed job: the built-in trainer on digits in DeepPod's
sandbox with its control group (memory, process and CPU limits: executor/cgroups.py) and its
own sized /dev/shm tmpfs (executor/job_shm.py) against the same sandbox without either (a
plain folder as its /dev/shm), runs alternated, the median throughput of each.

    sudo .venv/bin/python benchmarks/cgroup_overhead.py [--runs 3] [--epochs 2] [--memory-mb 4096] [--cpus N]
    [--cpu-quota]

Needs root (the sandbox switches to another identity); prints both medians and the ratio
(limited / unlimited; the aim is >= 0.98).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from deeppod.executor import cgroups, job_shm, sandbox
from deeppod.runtime.trainers.digits import write_digits

NOBODY = 65534


def run_once(tmp: Path, data: Path, args, limited: bool, n: int) -> float:
    work = tmp / f"work-{n}"
    work.mkdir()
    os.chown(work, NOBODY, NOBODY)
    job = tmp / f"job-{n}"
    job.mkdir()
    python = sorted({sys.prefix, sys.base_prefix, *[p for p in sys.path if p and os.path.isdir(p)]})
    sb = {"uid": NOBODY, "gid": NOBODY, "workdir": str(work), "python": python,
          "binds": [[str(work), str(work), True], [str(data), str(data), False]]}
    shm = tmp / f"shm-{n}"  # the job's /dev/shm: its own sized tmpfs (limited), or a plain folder
    if limited:
        sb["limits"] = {"memory_mb": args.memory_mb, "pids": cgroups.DEFAULT_PIDS, "cpus": args.cpus,
                        "cpu_quota": args.cpu_quota}
        job_shm.mount_shm(str(shm), NOBODY, NOBODY, args.memory_mb)
    else:
        shm.mkdir(mode=0o700)
        os.chown(shm, NOBODY, NOBODY)
    sb["shm"] = str(shm)
    command = [sys.executable, "-m", "deeppod.runtime.trainers.image_classifier", "--data", str(data),
               "--model", "small-cnn", "--epochs", str(args.epochs), "--batch-size", "64", "--lr", "0.05",
               "--output", str(work / "model")]
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "OMP_NUM_THREADS": str(os.cpu_count() or 1),
           "DEEPPOD_CHECKPOINT_DIR": str(work / "checkpoints")}
    (job / "spec.json").write_text(json.dumps({"command": command, "sandbox": sb,
                                               "workers": [{"rank": 0, "env": env}]}))
    try:
        out = subprocess.run([sys.executable, "-m", "deeppod.executor.sandbox", str(job), "0"], capture_output=True,
                             text=True, timeout=1800)
    finally:
        job_shm.unmount_shm(str(shm))
    if out.returncode != 0:
        raise SystemExit(f"the trainer failed ({out.returncode}): {out.stdout[-2000:]}{out.stderr[-2000:]}")
    rates = [float(x) for x in re.findall(r"\(([\d.]+) images/s\)", out.stdout)]
    return rates[-1]  # the last epoch: the loader and the model warmed up


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--memory-mb", type=int, default=4096)
    p.add_argument("--cpus", type=float, default=float(os.cpu_count() or 1),
                   help="the worker's CPUs: its CPU weight (default: every CPU, as a job asking for them gets)")
    p.add_argument("--cpu-quota", action="store_true", help="and a hard cap at --cpus (DEEPPOD_CPU_LIMIT=quota)")
    args = p.parse_args()
    if (why := sandbox.supported()) is not None or (why := cgroups.check()) is not None:
        raise SystemExit(f"cannot measure here: {why}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        os.chmod(tmp, 0o755)
        data = write_digits(tmp / "digits")
        results: dict[bool, list[float]] = {True: [], False: []}
        n = 0
        for i in range(args.runs):
            for limited in (i % 2 == 0, i % 2 != 0):  # alternated, so drift hits both alike
                n += 1
                results[limited].append(run_once(tmp, data, args, limited, n))
    on, off = statistics.median(results[True]), statistics.median(results[False])
    print(json.dumps({"limited_images_per_second": results[True], "unlimited_images_per_second": results[False]}))
    print(f"built-in trainer in the sandbox: with cgroups {on:.1f} images/s, without {off:.1f} images/s; "
          f"ratio {on / off:.3f} (median of {args.runs})")


if __name__ == "__main__":
    main()
