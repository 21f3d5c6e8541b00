"""What the kernel's limits cost a sandboxed job: the built-in trainer on digits in DeepPod's
sandbox with its control group (memory, process and CPU limits: executor/cgroups.py) and its
own sized /dev/shm tmpfs (executor/job_shm.py) against the same sandbox without either (a
folder of the host's /dev/shm, as jobs had before), in rounds.

    sudo .venv/bin/python benchmarks/cgroup_overhead.py [--rounds 5] [--pairs 2] [--epochs 4]
    [--memory-mb 4096] [--cpus N] [--cpu-quota]

A round runs each arm --pairs times, alternated (limited first in even rounds), and keeps each
arm's best run: a run's throughput is the median of its epochs after the first (the loader and
the model warmed up). The best of a few runs is what the limits cost, not what a neighbour on a
shared machine did to one run. Every round's ratio (limited / unlimited; the aim is >= 0.98 in
the worst round) is printed, and the CPU seconds each arm's runs used (the kernel's accounting is
CPU work, so it shows there first).

Needs root (the sandbox switches to another identity).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from deeppod.executor import cgroups, job_shm, sandbox
from deeppod.runtime.trainers.digits import write_digits

NOBODY = 65534


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_once(tmp: Path, data: Path, args, limited: bool, n: int) -> tuple[float, float]:
    """(images/s of the warm epochs, CPU seconds of the whole run, its loader workers included)."""
    work = tmp / f"work-{n}"
    work.mkdir()
    os.chown(work, NOBODY, NOBODY)
    job = tmp / f"job-{n}"
    job.mkdir()
    python = sorted({sys.prefix, sys.base_prefix, *[p for p in sys.path if p and os.path.isdir(p)]})
    sb = {"uid": NOBODY, "gid": NOBODY, "workdir": str(work), "python": python,
          "binds": [[str(work), str(work), True], [str(data), str(data), False]]}
    if limited:  # the job's /dev/shm: its own sized tmpfs, else a folder of the host's tmpfs
        shm = tmp / f"shm-{n}"
        sb["limits"] = {"memory_mb": args.memory_mb, "pids": cgroups.DEFAULT_PIDS, "cpus": args.cpus,
                        "cpu_quota": args.cpu_quota}
        job_shm.mount_shm(str(shm), NOBODY, NOBODY, args.memory_mb)
    else:
        shm = Path(tempfile.mkdtemp(prefix="deeppod-bench-", dir="/dev/shm"))
        os.chown(shm, NOBODY, NOBODY)
    sb["shm"] = str(shm)
    command = [sys.executable, "-m", "deeppod.runtime.trainers.image_classifier", "--data", str(data),
               "--model", "small-cnn", "--epochs", str(args.epochs), "--batch-size", "64", "--lr", "0.05",
               "--output", str(work / "model")]
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "OMP_NUM_THREADS": str(os.cpu_count() or 1),
           "DEEPPOD_CHECKPOINT_DIR": str(work / "checkpoints")}
    (job / "spec.json").write_text(json.dumps({"command": command, "sandbox": sb,
                                               "workers": [{"rank": 0, "env": env}]}))
    cpu = _children_cpu()
    try:
        out = subprocess.run([sys.executable, "-m", "deeppod.executor.sandbox", str(job), "0"], capture_output=True,
                             text=True, timeout=1800)
        cpu = _children_cpu() - cpu
    finally:
        if limited:
            job_shm.unmount_shm(str(shm))
        else:
            shutil.rmtree(shm, ignore_errors=True)
    if out.returncode != 0:
        raise SystemExit(f"the trainer failed ({out.returncode}): {out.stdout[-2000:]}{out.stderr[-2000:]}")
    rates = [float(x) for x in re.findall(r"\(([\d.]+) images/s\)", out.stdout)]
    return statistics.median(rates[1:] or rates), cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", "--runs", type=int, default=5)
    p.add_argument("--pairs", type=int, default=2, help="runs of each arm in a round; its best counts")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--memory-mb", type=int, default=4096)
    p.add_argument("--cpus", type=float, default=float(os.cpu_count() or 1),
                   help="the worker's CPUs: its CPU weight (default: every CPU, as a job asking for them gets)")
    p.add_argument("--cpu-quota", action="store_true", help="and a hard cap at --cpus (DEEPPOD_CPU_LIMIT=quota)")
    args = p.parse_args()
    if (why := sandbox.supported()) is not None or (why := cgroups.check()) is not None:
        raise SystemExit(f"cannot measure here: {why}")
    rounds = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        os.chmod(tmp, 0o755)
        data = write_digits(tmp / "digits")
        n = 0
        for i in range(args.rounds):
            runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
            for k in range(args.pairs):
                first = (i + k) % 2 == 0  # alternated, so drift hits both arms alike
                for limited in (first, not first):
                    n += 1
                    runs[limited].append(run_once(tmp, data, args, limited, n))
            on, off = max(r for r, _ in runs[True]), max(r for r, _ in runs[False])
            cpu_on, cpu_off = min(c for _, c in runs[True]), min(c for _, c in runs[False])
            rounds.append({"limited": on, "unlimited": off, "ratio": on / off,
                           "limited_cpu_s": cpu_on, "unlimited_cpu_s": cpu_off})
            print(f"round {i + 1}: with limits {on:.1f} images/s ({cpu_on:.1f} CPU s), "
                  f"without {off:.1f} images/s ({cpu_off:.1f} CPU s); ratio {on / off:.3f}", flush=True)
    print(json.dumps({"rounds": rounds}))
    worst = min(r["ratio"] for r in rounds)
    median = statistics.median(r["ratio"] for r in rounds)
    cpu = statistics.median(r["unlimited_cpu_s"] / r["limited_cpu_s"] for r in rounds)
    print(f"built-in trainer in the sandbox, limits and its own /dev/shm tmpfs against none: ratio {median:.3f} "
          f"median, {worst:.3f} worst round of {len(rounds)} (aim >= 0.98); CPU seconds without / with {cpu:.3f}")


if __name__ == "__main__":
    main()
