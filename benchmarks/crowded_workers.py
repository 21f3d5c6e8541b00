"""A CPU job whose workers' math threads outnumber the node's cores (several gloo workers on a
small node, or logical GPU slots offered with more CPUs than the node has): DeepPod's supervisor,
which starts such workers with idle OpenMP threads sleeping (executor/affinity.quiet_threads),
against plain ``torchrun`` with the same workers and threads, whose idle threads spin.

Both run the built-in trainer (``deeppod.runtime.trainers.image_classifier``: small-cnn, 16 px
digits, one epoch, no step delay, its default loader workers) as W workers of T threads each
(default: 3 workers, as many threads as the machine has cores), one round each system per
round, and the trainer's own images/s for the epoch is compared.

``--jobs J`` runs J such jobs at once (their images/s summed): ``--jobs 2 --workers 1`` is two
jobs that each fit the node, on a node whose CPUs the server offers beyond its cores (each
worker's spec says the node offers J x W x T CPUs, as ``deeppod server --cpus`` above the
machine's would).

    python benchmarks/crowded_workers.py [--workers 3] [--threads N] [--jobs 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from deeppod.bench.spread import LoadMeter, Spread, machine
from deeppod.executor.base import LaunchSpec, WorkerSpec
from deeppod.executor.local import write_spec
from deeppod.runtime.trainers.digits import write_digits

RATE = re.compile(r"epoch 1/\d+: .*\(([\d.]+) images/s\)")


def trainer(data: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "deeppod.runtime.trainers.image_classifier", "--data", str(data),
            "--model", "small-cnn", "--image-size", "16", "--epochs", "1", "--batch-size", "32",
            "--lr", "0.05", "--output", str(out)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(threads: int, ckpt: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEEPPOD_", "OMP_WAIT"))}
    env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
                "DEEPPOD_CHECKPOINT_DIR": str(ckpt), "PYTHONUNBUFFERED": "1"})
    return env


def rate(text: str) -> float:
    found = RATE.findall(text)
    if not found:
        raise SystemExit("the trainer printed no epoch rate:\n" + text[-3000:])
    return float(found[-1])


def torchrun(data: Path, work: Path, workers: int, threads: int, jobs: int = 1) -> float:
    procs = []
    for j in range(jobs):
        env = base_env(threads, work / f"ckpt-{j}")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(workers),
             "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
             *trainer(data, work / f"model-{j}")[1:]], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True))
    total = 0.0
    for p in procs:
        out, _ = p.communicate(timeout=900)
        if p.returncode:
            raise SystemExit(out[-3000:])
        total += rate(out)
    return total


def deeppod(data: Path, work: Path, workers: int, threads: int, jobs: int = 1) -> float:
    """The jobs as DeepPod's supervisor starts them (the worker contract's variables, unsandboxed)."""
    offered = jobs * workers * threads if jobs > 1 else None  # what a server fitting them all would offer
    procs = [_supervised(data, work / f"job-{j}", workers, threads, offered) for j in range(jobs)]
    total = 0.0
    for p, job_dir in procs:
        p.wait(timeout=900)
        text = (job_dir / "logs" / "rank-0.log").read_text()
        if p.returncode:
            raise SystemExit(text[-3000:])
        total += rate(text)
    return total


def _supervised(data: Path, work: Path, workers: int, threads: int, offered: int | None):
    work.mkdir(parents=True)
    port, job_dir = free_port(), work / "job"
    specs = []
    for r in range(workers):
        env = base_env(threads, work / "ckpt")
        env.update({"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(workers),
                    "LOCAL_WORLD_SIZE": str(workers), "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port)})
        specs.append(WorkerSpec(r, "local", env, offered))
    write_spec(LaunchSpec(job_id=1, job_dir=job_dir, command=trainer(data, work / "model"), workdir=str(work),
                          workers=specs))
    return subprocess.Popen([sys.executable, "-m", "deeppod.executor.supervisor", str(job_dir)]), job_dir


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"{machine()}; {args.jobs} job(s) at once of {args.workers} workers x {args.threads} threads on "
          f"{len(os.sched_getaffinity(0))} cores", flush=True)
    meter = LoadMeter()
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        data = write_digits(Path(tmp) / "digits")
        for n in range(args.rounds):
            plain = torchrun(data, Path(tempfile.mkdtemp(dir=tmp)), args.workers, args.threads, args.jobs)
            ours = deeppod(data, Path(tempfile.mkdtemp(dir=tmp)), args.workers, args.threads, args.jobs)
            ratios.append(ours / plain)
            print(f"round {n + 1}: torchrun {plain:.1f} images/s, deeppod {ours:.1f} images/s, "
                  f"{ours / plain:.2f}x", flush=True)
    meter.stop()
    print(Spread.of(ratios).line("deeppod / torchrun, images/s"))
    print(meter.line())


if __name__ == "__main__":
    main()
