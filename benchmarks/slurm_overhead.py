"""What DeepPod on Slurm adds to a job: the time from the submit to the first line of the user's
script, and a training loop's throughput, against a plain ``sbatch`` of the same script on the
same Slurm, side by side. Aim (issue 73): at most 1 s added to the start, at least 0.98 of the
throughput.

    python benchmarks/slurm_overhead.py [--rounds 10] [--steps 3000] [--out FILE]

It starts a one-host Slurm of its own (``scripts/slurm_local``: needs root and Debian's Slurm)
and a ``deeppod server --executor slurm`` on it (single-user: jobs run as the caller, as a
plain ``sbatch`` of the caller's does). Each round runs, in turn:

- **start**: ``python -c 'print(time.time())'``: DeepPod, from ``POST /v1/jobs`` (the SDK's
  submit) to the time the script printed; plain, from ``sbatch`` to the same. Both include
  Python's own start.
- **throughput**: one CPU worker (1 CPU, Slurm's ``--cpus-per-task=1``) training a small MLP
  for ``--steps`` steps with torch; the script measures its own steps/s after a warm-up. DeepPod
  runs it as any job (its batch step, one ``srun`` task per worker, the job contract, which sets
  ``OMP_NUM_THREADS`` to the worker's CPUs); plain is ``sbatch --wrap 'export
  OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK; srun python train.py'``, as Slurm sites tell their users
  to write it (without it torch starts a thread per core of the node on its one CPU: 35x slower here).

Each job is submitted once the node is idle and a second has passed, so both start from the
same state of Slurm. Medians over the rounds; the ratio is DeepPod's over plain (throughput) and
DeepPod's minus plain (start). Slurm's own start of the same sbatch moves by seconds between
rounds (its scheduling passes): many rounds, medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from deeppod import Client  # noqa: E402
from deeppod.bench.server import Server  # noqa: E402

FIRST_LINE = "import time; print(time.time(), flush=True)"
TRAIN = """
import sys, time
import torch
torch.manual_seed(0)
steps = int(sys.argv[1])
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
def step():
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
for _ in range(max(5, steps // 10)):  # warm-up
    step()
began = time.perf_counter()
for _ in range(steps):
    step()
print(f"steps/s {steps / (time.perf_counter() - began):.3f}", flush=True)
"""


def slurm(conf: str, *args: str) -> str:
    return subprocess.run(list(args), env={**os.environ, "SLURM_CONF": conf}, capture_output=True, text=True,
                          check=True, timeout=60).stdout


def settle(conf: str) -> None:
    """Until the node is idle, and a second more: each job starts from the same state of Slurm (a
    job submitted while the last one completes waits for a later scheduling pass, seconds)."""
    deadline = time.monotonic() + 120
    while slurm(conf, "sinfo", "-h", "-o", "%T").strip() != "idle" and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)


def plain(conf: str, work: Path, command: str, name: str) -> tuple[float, str]:
    """sbatch of ``command`` as one task of one CPU: (when sbatch was called, what it printed)."""
    settle(conf)
    out = work / f"{name}.out"
    out.unlink(missing_ok=True)
    began = time.time()
    wrap = f"export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK; srun {command}"
    job = slurm(conf, "sbatch", "--parsable", "--ntasks=1", "--cpus-per-task=1", f"--chdir={work}",
                f"--output={out}", f"--wrap={wrap}").strip().split(";")[0]
    deadline = time.monotonic() + 300
    while slurm(conf, "squeue", "-h", "-j", job, "-o", "%t").strip():
        if time.monotonic() > deadline:
            raise RuntimeError(f"plain Slurm job {job} did not end")
        time.sleep(0.05)
    return began, out.read_text()


def deeppod(c: Client, conf: str, work: Path, command: list[str], pythonpath: str) -> tuple[float, str]:
    """The same through DeepPod: (when the submit was called, what rank 0 printed)."""
    settle(conf)
    began = time.time()
    job = c.submit(command, gpus_per_worker=0, cpus_per_worker=1, workdir=str(work), env={"PYTHONPATH": pythonpath})
    final = c.wait(job["id"], timeout=300)
    if final["state"] != "succeeded":
        raise RuntimeError(f"job {job['id']} {final['state']}: {final['reason']}")
    return began, b"".join(c.logs(job["id"], rank=0)).decode()


def first_line_after(began: float, text: str) -> float:
    return float(text.strip().splitlines()[0]) - began


def rate(text: str) -> float:
    return float(text.rsplit("steps/s ", 1)[1].split()[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "slurm_overhead.json")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("slurm_overhead: a local Slurm needs root (slurmd starts jobs as their users)", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="deeppod-bench-slurm-"))
    site, work = root / "slurm", root / "work"
    work.mkdir()
    (work / "train.py").write_text(textwrap.dedent(TRAIN))
    up = subprocess.run([str(ROOT / "scripts" / "slurm_local"), "up", str(site)], capture_output=True, text=True,
                        timeout=300)
    if up.returncode != 0:
        print(up.stdout + up.stderr, file=sys.stderr)
        return 1
    conf = str(site / "slurm.conf")
    pythonpath = os.pathsep.join(p for p in sys.path if p)
    server = None
    starts: dict[str, list[float]] = {"deeppod": [], "plain": []}
    rates: dict[str, list[float]] = {"deeppod": [], "plain": []}
    try:
        server = Server(root / "home", {"DEEPPOD_EXECUTOR": "slurm", "DEEPPOD_SLURM_CONF": conf}).start()
        c = Client(server.url, server.admin_token)
        python = sys.executable
        for r in range(args.rounds):
            b, text = plain(conf, work, f"{python} -c '{FIRST_LINE}'", "first")
            starts["plain"].append(first_line_after(b, text))
            b, text = deeppod(c, conf, work, [python, "-c", FIRST_LINE], pythonpath)
            starts["deeppod"].append(first_line_after(b, text))
            _, text = plain(conf, work, f"{python} train.py {args.steps}", "train")
            rates["plain"].append(rate(text))
            _, text = deeppod(c, conf, work, [python, "train.py", str(args.steps)], pythonpath)
            rates["deeppod"].append(rate(text))
            print(f"round {r + 1}: start plain {starts['plain'][-1]:.2f} s, deeppod {starts['deeppod'][-1]:.2f} s; "
                  f"steps/s plain {rates['plain'][-1]:.1f}, deeppod {rates['deeppod'][-1]:.1f}", flush=True)
    finally:
        if server is not None:
            server.stop()
        subprocess.run([str(ROOT / "scripts" / "slurm_local"), "down", str(site)], capture_output=True, timeout=120)
    start = {k: statistics.median(v) for k, v in starts.items()}
    thr = {k: statistics.median(v) for k, v in rates.items()}
    result = {"rounds": args.rounds, "steps": args.steps, "start_s": start, "steps_per_s": thr,
              "start_added_s": start["deeppod"] - start["plain"], "throughput_ratio": thr["deeppod"] / thr["plain"],
              "runs": {"start_s": starts, "steps_per_s": rates}}
    print(f"\nsubmit to the script's first line (median of {args.rounds}): plain sbatch {start['plain']:.2f} s, "
          f"DeepPod {start['deeppod']:.2f} s: DeepPod adds {result['start_added_s']:+.2f} s (aim <= 1 s)")
    print(f"training loop (steps/s, median): plain {thr['plain']:.1f}, DeepPod {thr['deeppod']:.1f}: "
          f"deeppod / plain {result['throughput_ratio']:.3f} (aim >= 0.98)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
