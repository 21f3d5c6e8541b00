"""Resize a running training job: in place (deeppod.runtime.Resizer) vs checkpoint restart.

    python benchmarks/resize.py [--models resnet18 resnet50] [--moves 2:1 1:2 2:4] [--image-size 64]
    python benchmarks/resize.py --quick     # every move once on resnet18: a check that it runs, minutes

Both paths run the built-in trainer (deeppod.runtime.trainers.image_classifier) with its
defaults (2 loader workers per worker) and 1 CPU per worker (the platform's default request
for a CPU worker: ``--cpus``) under the local executor's supervisor, on a generated image
folder, with gloo on CPU (NCCL when CUDA is there). Measured for each
model and move: seconds from the resize decision to the first completed training step at
the new size.

- in place: the control plane's world file is written (and, on a grow, the new workers
  are handed to the supervisor); the time ends when rank 0 acknowledges its first step at
  the new size (the acknowledgement carries its wall-clock time). On a grow the job keeps
  warm spares first, as the control plane has it do (``--spares``, the default of
  DEEPPOD_SPARE_WORKERS): processes of the job parked in ``runtime.init()`` with torch
  imported, which become the new workers. "in place, cold joiners" is the same grow with
  no spares: the supervisor starts the new workers from nothing;
- restart: SIGTERM, every worker checkpoints and exits 75, the job starts again at the
  new size, loads the checkpoint and trains; the time ends at its first recorded step.

Also measured: how long training stops. A restart trains not at all from the SIGTERM to its
first step. In place, the workers that stay go on training while joiners start; they stop
only for the switch itself (the acknowledgement's ``switch_seconds``).

Each move first runs a warm-up round (``--warmup``), printed and not counted. The first round of
ResNet-50 2 -> 4, the first move to need four workers' memory, was about twice as slow on both
paths in every recorded run. The suspected cause, not shown directly: on these VMs, memory not
used lately costs up to three times as much to touch. The warm-up does not always absorb it
(docs/benchmarks.md, session 25).

Prints a table and the ratios restart / in place; writes benchmarks/results/resize.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from deeppod.bench.spread import LoadMeter, Spread, machine  # noqa: E402
from deeppod.contract import (  # noqa: E402
    ENV_JOINING,
    ENV_WORLD_FILE,
    ENV_WORLD_GENERATION,
    JOINER_READY,
    SPARE_PARKED,
    WORLD_ACK,
    free_port,
    worker_env,
)
from deeppod.executor.base import LaunchSpec, WorkerSpec  # noqa: E402
from deeppod.executor.local import LocalExecutor  # noqa: E402
from deeppod.job_folder import JobFolder  # noqa: E402
from deeppod.settings import Settings  # noqa: E402

PHASES = ("joiners", "tail", "group", "handover", "first_step")
TRAINER = [sys.executable, "-m", "deeppod.runtime.trainers.image_classifier"]


def make_images(folder: Path, classes: int = 4, per_class: int = 250, size: int = 72) -> Path:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(classes):
        (folder / str(c)).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            pixels[..., c % 3] //= 2  # the class shows in the colour
            Image.fromarray(pixels).save(folder / str(c) / f"{i}.jpg", quality=90)
    return folder


def spec(job_dir: Path, rank: int, world: int, port: int, restart: int, generation=0, joining=False,
         cpus: float = 1.0) -> WorkerSpec:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEEPPOD_", "PYTEST_"))}
    if cpus <= 0:  # share the machine among the workers of this size
        cpus = max(1, (os.cpu_count() or 2) // max(world, 1))
    env = worker_env(env, {}, job_id=0, rank=rank, world_size=world, local_rank=rank, local_world_size=world,
                     node_rank=0, master_addr="127.0.0.1", master_port=port, gpus=(), cpus=cpus,
                     checkpoint_dir=str(job_dir / "checkpoints"), api_url="", token="", restart_count=restart)
    env.update({ENV_WORLD_FILE: str(JobFolder(job_dir).world_file), ENV_WORLD_GENERATION: str(generation)})
    if joining:
        env[ENV_JOINING] = "1"
    return WorkerSpec(rank, "n", env)


def wait(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)


def lines(records: Path, run: int) -> int:
    return sum(1 for f in records.glob(f"run{run}-rank*.txt") for _ in f.open())


def first_step_at(records: Path, run: int) -> float | None:
    """When the first step of run ``run`` was recorded (its file's first write)."""
    times = [f.stat().st_mtime for f in records.glob(f"run{run}-rank*.txt") if f.stat().st_size]
    return min(times) if times else None


def one(model: str, old: int, new: int, how: str, data: Path, work: Path, args, run: int = 0) -> tuple[float, float]:
    ex = LocalExecutor()
    name = f"{model}-{old}-{new}-{how}-{run}"
    job_dir, records = work / name, work / f"{name}-records"
    (job_dir / "checkpoints").mkdir(parents=True)
    records.mkdir()
    JobFolder(job_dir).reset_world()
    command = TRAINER + ["--data", str(data), "--model", model, "--image-size", str(args.image_size),
                         "--epochs", "3", "--batch-size", str(args.batch_size), "--lr", "0.01",
                         "--record-samples", str(records)]
    port = free_port()
    h = ex.launch(LaunchSpec(job_id=0, job_dir=job_dir, command=command, workdir=str(job_dir), grace_seconds=120,
                             workers=[spec(job_dir, r, old, port, 0, cpus=args.cpus) for r in range(old)]))
    wait(lambda: lines(records, 0) >= old * args.warm_steps, 600, f"{args.warm_steps} steps on {old} workers")
    if how == "in-place" and new > old and args.spares:
        # as the controller does once the job is resizable and below its largest size (here: new)
        count = min(args.spares, new - old)
        ex.keep_spares(h, count)
        wait(lambda: all((job_dir / "checkpoints" / SPARE_PARKED.format(n=n)).exists() for n in range(count)),
             600, "the warm spares to park")
    decided = time.time()
    if how in ("in-place", "in-place-cold"):
        port = free_port()
        world = {"generation": 1, "world_size": new, "master_addr": "127.0.0.1", "master_port": port,
                 "decided_at": decided}
        if new > old:  # as the controller does: the joiners first, the world once they are ready
            ex.add_workers(h, [spec(job_dir, r, new, port, 0, generation=1, joining=True, cpus=args.cpus)
                               for r in range(old, new)], 1)
            wait(lambda: all((job_dir / "checkpoints" / JOINER_READY.format(rank=r)).exists()
                             for r in range(old, new)), 600, "the joiners to be ready")
        world_at = time.time()
        JobFolder(job_dir).write_world(world)

        def acked():
            try:
                ack = json.loads((job_dir / "checkpoints" / WORLD_ACK).read_text())
            except (OSError, ValueError):
                return None
            return ack if ack.get("generation") == 1 else None

        ack = wait(acked, 600, "the acknowledgement")
        took, paused = ack["at"] - decided, ack["switch_seconds"]
        phases = {"joiners": world_at - decided,  # a grow: the joiners (spares handed the work) say they are ready
                  "tail": ack["began_at"] - world_at,  # the old size's step ends; the workers agree to switch
                  "group": ack["group_seconds"], "handover": ack["handover_seconds"],
                  "first_step": ack["at"] - ack["began_at"] - ack["switch_seconds"]}  # loader, then one step
    else:
        ex.terminate(h)
        wait(lambda: ex.poll(h).finished, 600, "the workers to checkpoint and exit")
        port = free_port()
        h = ex.launch(LaunchSpec(job_id=0, job_dir=job_dir, command=command, workdir=str(job_dir), grace_seconds=120,
                                 workers=[spec(job_dir, r, new, port, 1, cpus=args.cpus) for r in range(new)]))
        took = wait(lambda: first_step_at(records, 1), 600, "the first step after the restart") - decided
        paused, phases = took, {}
    ex.terminate(h)
    wait(lambda: ex.poll(h).finished, 600, "the job to stop")
    log = (job_dir / "logs" / "rank-0.log").read_text()
    if how != "restart" and "resized in place" not in log:
        raise RuntimeError(f"{model} {old}->{new}: no in-place resize in the log:\n{log[-2000:]}")
    if how != "restart":  # the step under way given up for the new world (Resizer.interruptible)
        phases["gave_up"] = float("the step under way was given up" in log)
    return took, paused, phases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet18", "resnet50"])
    ap.add_argument("--moves", nargs="+", default=["2:1", "1:2", "2:4"])
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8, help="global batch at the starting size")
    ap.add_argument("--warm-steps", type=int, default=3, help="steps each worker trains before the resize")
    ap.add_argument("--repeat", type=int, default=3, help="rounds: every path once a round, interleaved")
    ap.add_argument("--warmup", type=int, default=1,
                    help="rounds run first and not counted (a move's first round was slower on both paths; "
                         "suspected: the VM's first touch of memory not used lately)")
    ap.add_argument("--cpus", type=float, default=1.0,
                    help="CPU request per worker, its thread count (default: the platform's for a CPU worker; "
                         "0: the machine's cores over the workers, so a restart at a smaller size gets more "
                         "threads than the workers that stay in place keep)")
    ap.add_argument("--spares", type=int, default=Settings().spare_workers,
                    help="warm spares a growing job keeps (DEEPPOD_SPARE_WORKERS' default)")
    ap.add_argument("--quick", action="store_true",
                    help="every move once, by every path, on the first model only, with no warm-up round "
                         "(minutes, not the full run's half hour; not a result to record)")
    ap.add_argument("--out", type=Path, default=None,
                    help="the JSON results (default: benchmarks/results/resize.json; resize-quick.json with --quick)")
    a = ap.parse_args()
    if a.quick:
        a.models, a.repeat, a.warmup = a.models[:1], 1, 0
    meter = LoadMeter()
    print(machine())
    rows, warm = [], []
    with tempfile.TemporaryDirectory(prefix="deeppod-resize-") as tmp:
        work = Path(tmp)
        data = make_images(work / "images")
        spares = a.spares
        for model in a.models:
            for move in a.moves:
                old, new = (int(x) for x in move.split(":"))
                for run in range(-a.warmup, a.repeat):  # negative: a warm-up round, shown and not counted
                    # interleaved: the same machine state for all; a shrink has no joiners to warm
                    for how in ("in-place", "in-place-cold", "restart") if new > old else ("in-place", "restart"):
                        a.spares = 0 if how == "in-place-cold" else spares
                        t, paused, phases = one(model, old, new, how, data, work, a, run)
                        row = {"model": model, "from": old, "to": new, "how": how, "seconds": round(t, 2),
                               "paused": round(paused, 2), "phases": {k: round(v, 3) for k, v in phases.items()}}
                        (warm if run < 0 else rows).append(row)
                        print(f"{model} {old}->{new} {how}{' (warm-up)' if run < 0 else ''}: {t:.2f} s to the first "
                              f"step, training stopped {paused:.2f} s", flush=True)
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
    print(f"\n{device}, {platform.python_version()}, torch {torch.__version__}, image size {a.image_size}, "
          f"global batch {a.batch_size}, loader workers: the trainer's default, "
          f"CPUs per worker: {a.cpus:g}" + (" (the cores over the workers)" if a.cpus <= 0 else ""))
    print("| model | move | to the first step at the new size: in place / in place, cold joiners / restart (s) "
          "| ratio | training stopped: in place / restart (s) | ratio |")
    print("|---|---|---|---|---|---|")
    summary = []
    for model in a.models:
        for move in a.moves:
            old, new = (int(x) for x in move.split(":"))

            def med(how, key="seconds"):
                xs = sorted(r[key] for r in rows if (r["model"], r["from"], r["to"], r["how"]) ==
                            (model, old, new, how))
                return xs[len(xs) // 2] if xs else None

            ip, cold, rs = med("in-place"), med("in-place-cold"), med("restart")
            ipp, rsp = med("in-place", "paused"), med("restart", "paused")
            summary.append({"model": model, "from": old, "to": new, "in_place_s": ip, "in_place_cold_s": cold,
                            "restart_s": rs, "ratio": round(rs / ip, 2), "in_place_paused_s": ipp,
                            "restart_paused_s": rsp, "paused_ratio": round(rsp / max(ipp, 1e-3), 1),
                            "spares": min(spares, new - old) if new > old else 0})
            cold_s = "-" if cold is None else f"{cold:.2f}"
            print(f"| {model} | {old} -> {new} | {ip:.2f} / {cold_s} / {rs:.2f} | {rs / ip:.1f}x | {ipp:.2f} / "
                  f"{rsp:.2f} | {rsp / max(ipp, 1e-3):.0f}x |")
    print(f"\nper round (--repeat {a.repeat}: every path once a round), restart / in place: median (worst-best)")
    for entry in summary:
        def times(how, e=entry):
            return [r["seconds"] for r in rows if (r["model"], r["from"], r["to"], r["how"]) ==
                    (e["model"], e["from"], e["to"], how)]
        sp = Spread.of([rs / ip for ip, rs in zip(times("in-place"), times("restart"))])
        entry["spread"] = sp.as_dict()
        print(f"  {entry['model']} {entry['from']} -> {entry['to']}: " + sp.line("restart / in place", aim=5.0))
        w = {r["how"]: r["seconds"] for r in warm if (r["model"], r["from"], r["to"]) ==
             (entry["model"], entry["from"], entry["to"])}
        if w:
            entry["warmup_ratio"] = round(w["restart"] / w["in-place"], 2)
            print(f"    warm-up round, not counted: {w['in-place']:.2f} s in place, {w['restart']:.2f} s restart, "
                  f"{entry['warmup_ratio']:.2f}x")
    print("\nin place, where the time to the first step goes: median seconds (share of the median total)")
    for entry in summary:
        runs = [r for r in rows if (r["model"], r["from"], r["to"], r["how"]) ==
                (entry["model"], entry["from"], entry["to"], "in-place")]
        entry["phases"] = {k: sorted(r["phases"][k] for r in runs)[len(runs) // 2] for k in PHASES}
        total = entry["in_place_s"] or 1e-9
        gave_up = sum(r["phases"].get("gave_up", 0) for r in runs)
        print(f"  {entry['model']} {entry['from']} -> {entry['to']} ({total:.2f} s): " + ", ".join(
            f"{k} {v:.2f} s ({100 * v / total:.0f}%)" for k, v in entry["phases"].items())
            + f"; the old step given up in {gave_up:.0f} of {len(runs)}")
    print(meter.line())
    out = a.out or ROOT / "benchmarks" / "results" / ("resize-quick.json" if a.quick else "resize.json")
    out.write_text(json.dumps({"device": device, "machine": machine(), "other_cores": round(meter.cores(), 2),
                               "cpus_per_worker": a.cpus, "warmup_runs": warm, "runs": rows,
                               "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
