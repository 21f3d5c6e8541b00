"""Hyperparameter search: time to a target validation accuracy, DeepPod tune with ASHA against
Optuna TPE without pruning run one trial at a time (the way most users start), and Ray Tune
with ASHA when a Python with ``ray[tune]`` is given.

Same objective for every system (benchmarks/tune_task.py: a small CNN, SGD, 27 epochs at
most, 5 hyperparameters), same trial budget, same TPE sampler and seed:

- ``optuna``: ``study.optimize(objective, n_trials)`` in one process, no pruner; torch uses
  every core of the machine for the one trial.
- ``deeppod``: a running ``deeppod server --gpus P`` (P logical GPU slots; the embedded
  defaults otherwise), ``Client.create_experiment(..., sampler="tpe", pruner="asha",
  parallel=P)``; every trial is a job (a process of its own) with the server's default CPU
  share.
- ``deeppod-reuse``: the same search with ``reuse=True``: at most P processes, each runs trial
  after trial (``runtime.trials()``), torch imported and the data read once per process.
- ``ray``: ``Tuner`` with ``OptunaSearch`` (TPE, same seed), ``ASHAScheduler`` (grace period
  ``--prune-after`` epochs, reduction factor 3, max 27 epochs), P concurrent trials of 1 CPU each.

``--prune-after N`` is the first step (epoch) at which DeepPod's pruner may stop a trial
(``prune_after``: ASHA's rungs at N, 3N, 9N, ...); the default, 1, is the platform's.

Every trial appends one line per epoch to a log with the wall clock, so "time to target" is
read the same way for all: from the moment the search is asked for to the first epoch of any
trial at or above the target. The whole search's time and the best accuracy of a trial that
ran all its epochs are printed too (same final accuracy is part of the aim).

    python benchmarks/tune.py [--task digits gratings] [--trials 20] [--parallel 2] [--seeds 1 2 3]
        [--systems optuna,deeppod,deeppod-reuse] [--pruner asha] [--prune-after 1] [--ray-python
        /path/to/python-with-ray-tune]

Each seed is a round: every system runs it once, one after another, so a busy moment costs
them all; the ratio to Optuna is printed per round with its median and worst round (a claim
is met when the worst round meets it), and the CPU other processes used meanwhile.

A Python for Ray: ``python3.11 -m venv /tmp/rt && /tmp/rt/bin/pip install "ray[tune]==2.60.0"
torch==2.14.1 scikit-learn optuna``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from deeppod.bench.spread import LoadMeter, Spread, machine

HERE = Path(__file__).resolve().parent
TARGETS = {"digits": 0.98, "gratings": 0.81}


def optuna_space(trial, space: dict) -> dict:
    out = {}
    for name, p in space.items():
        if p["type"] == "categorical":
            out[name] = trial.suggest_categorical(name, p["choices"])
        else:
            out[name] = trial.suggest_float(name, p["low"], p["high"], log=p.get("log", False))
    return out


def run_optuna(task: str, trials: int, seed: int, log: str, data: str) -> None:
    """The baseline, in this process: sequential TPE, no pruning."""
    import optuna
    import tune_task

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def objective(trial):
        params = optuna_space(trial, tune_task.SPACE)
        return tune_task.train(params, task, tune_task.EPOCHS,
                               lambda e, a: tune_task.log_line(log, str(trial.number), e, a) or False, data)

    optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed)).optimize(
        objective, n_trials=trials)


def run_ray(task: str, trials: int, parallel: int, seed: int, log: str, data: str, grace: int = 1) -> None:
    """Ray Tune in this process (a Python that has ray[tune], torch, scikit-learn, optuna)."""
    os.environ["PYTHONPATH"] = str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", "")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    import ray
    import tune_task
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    def trainable(config):
        trial_id = tune.get_context().get_trial_id()

        def on_epoch(epoch, acc):
            tune_task.log_line(log, trial_id, epoch, acc)
            tune.report({"val_acc": acc, "epoch": epoch + 1})
            return False

        tune_task.train(config, task, tune_task.EPOCHS, on_epoch, data)

    dist = {"float": lambda p: (tune.loguniform if p.get("log") else tune.uniform)(p["low"], p["high"]),
            "categorical": lambda p: tune.choice(p["choices"])}
    space = {name: dist[p["type"]](p) for name, p in tune_task.SPACE.items()}
    ray.init(num_cpus=parallel, include_dashboard=False, logging_level="ERROR")
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(
            metric="val_acc", mode="max", num_samples=trials, max_concurrent_trials=parallel,
            search_alg=OptunaSearch(seed=seed),
            scheduler=ASHAScheduler(time_attr="epoch", max_t=tune_task.EPOCHS, grace_period=grace,
                                    reduction_factor=3)),
        run_config=tune.RunConfig(storage_path=tempfile.mkdtemp(prefix="raytune-"), verbose=0))
    tuner.fit()
    ray.shutdown()


def run_deeppod(server, task: str, trials: int, parallel: int, seed: int, log: str, data: str,
                reuse: bool = False, pruner: str = "asha", prune_after: int = 1) -> None:
    import tune_task

    from deeppod import Client

    c = Client(server.url, server.admin_token)
    flags = ["--reuse"] if reuse else \
        [a for name in tune_task.SPACE for a in ("--" + name.replace("_", "-"), "{" + name + "}")]
    space = {k: {**p, "env_only": True} if reuse else p for k, p in tune_task.SPACE.items()}
    name = f"bench-{task}-{seed}-{time.time_ns()}"
    c.create_experiment(name, [sys.executable, str(HERE / "tune_task.py"), "--task", task, "--log", log, "--data", data,
                               "--epochs", str(tune_task.EPOCHS), *flags],
                        space=space, metric="val_acc", mode="max", trials=trials, parallel=parallel,
                        sampler="tpe", pruner=pruner, prune_after=prune_after, seed=seed, workdir=str(HERE),
                        reuse=reuse)
    while (e := c.experiment(name))["state"] in ("running", "stopping"):
        time.sleep(0.5)
    if e["state"] != "completed":
        raise RuntimeError(f"the search ended {e['state']}: {e['reason']}")
    counts = {}
    for t in e["trial_table"]:
        counts[t["state"]] = counts.get(t["state"], 0) + 1
    print(f"    deeppod trials: {counts}", flush=True)


def summarize(log: str, began: float, ended: float, target: float, epochs: int) -> dict:
    lines = [json.loads(x) for x in Path(log).read_text().splitlines()] if Path(log).exists() else []
    hit = [x["at"] for x in lines if x["acc"] >= target]
    full = [x["acc"] for x in lines if x["epoch"] == epochs - 1]
    return {"to_target_s": (min(hit) - began) if hit else None, "search_s": ended - began,
            "best_full": max(full, default=None), "best_any": max((x["acc"] for x in lines), default=None),
            "trials": len({x["trial"] for x in lines}), "epochs": len(lines)}


def measure(system: str, task: str, seed: int, args, root: Path, server) -> dict:
    import tune_task

    log, data = str(root / f"{system}-{task}-{seed}.jsonl"), str(root / f"{task}.npz")
    common = ["--task", task, "--trials", str(args.trials), "--seeds", str(seed), "--log", log, "--data", data,
              "--epochs", str(tune_task.EPOCHS)]
    began = time.time()
    if system == "optuna":
        subprocess.run([sys.executable, __file__, "_optuna", *common], check=True)
    elif system == "ray":
        # its own HOME: Ray writes an auth token to ~/.ray that a later `ray start` here would trip on
        (root / "ray-home").mkdir(exist_ok=True)
        subprocess.run([args.ray_python, __file__, "_ray", *common, "--parallel", str(args.parallel),
                        "--prune-after", str(args.prune_after)], check=True,
                       stdout=subprocess.DEVNULL, stderr=open(root / f"ray-{task}-{seed}.err", "w"),
                       env={**os.environ, "HOME": str(root / "ray-home")})
    else:
        run_deeppod(server, task, args.trials, args.parallel, seed, log, data, reuse=system == "deeppod-reuse",
                    pruner=args.pruner, prune_after=args.prune_after)
    r = summarize(log, began, time.time(), args.target or TARGETS[task], tune_task.EPOCHS)
    print(f"  {task} seed {seed} {system}: {json.dumps(r)}", flush=True)
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
        Path(args.keep, Path(log).name).write_text(Path(log).read_text())
    return r


def median(values: list):
    values = sorted(v for v in values if v is not None)
    return values[len(values) // 2] if len(values) % 2 else (
        (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2 if values else None)


def fmt(v, unit="s"):
    return "never" if v is None else (f"{v:.1f} {unit}" if unit else f"{v:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", nargs="?", default="bench", choices=["bench", "_optuna", "_ray"])
    ap.add_argument("--task", nargs="+", default=["digits", "gratings"])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1])
    ap.add_argument("--pruner", default="asha", choices=["asha", "asha-promote", "hyperband", "median", "none"],
                    help="DeepPod's pruner (Ray Tune's side is ASHA whatever this says)")
    ap.add_argument("--prune-after", type=int, default=1,
                    help="the first step (epoch) at which a trial may be stopped: DeepPod's prune_after, Ray's grace")
    ap.add_argument("--target", type=float, help="validation accuracy to reach (default: per task)")
    ap.add_argument("--ray-python", help="a Python with ray[tune], torch, scikit-learn and optuna")
    ap.add_argument("--systems", default="optuna,deeppod,deeppod-reuse",
                    help="deeppod-reuse: a trial's process runs the next (--reuse, runtime.trials())")
    ap.add_argument("--keep", help="a folder to copy every run's per-epoch log to")
    ap.add_argument("--server-cpus", type=int,
                    help="the CPUs DeepPod's server offers (default: the machine's); more than the cores gives "
                         "each trial more threads, which then sleep when idle (docs/scheduler.md)")
    ap.add_argument("--epochs", type=int, help="the most epochs a trial runs (default: tune_task's 27; fewer only "
                                                "to check that the benchmark runs: its figures are then not the aims')")
    ap.add_argument("--log")
    ap.add_argument("--data")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    if args.epochs:
        import tune_task

        tune_task.EPOCHS = args.epochs
    if args.mode == "_optuna":
        return run_optuna(args.task[0], args.trials, args.seeds[0], args.log, args.data)
    if args.mode == "_ray":
        return run_ray(args.task[0], args.trials, args.parallel, args.seeds[0], args.log, args.data, args.prune_after)
    import tune_task

    from deeppod.bench.server import Server

    systems = args.systems.split(",") + (["ray"] if args.ray_python else [])
    meter = LoadMeter()
    print(machine())
    with tempfile.TemporaryDirectory(prefix="bench-tune-") as tmp:
        root = Path(tmp)
        for task in args.task:
            tune_task.prepare(task, str(root / f"{task}.npz"))
        server = Server(root / "home", gpus=args.parallel,
                        env={"DEEPPOD_CPUS": str(args.server_cpus)} if args.server_cpus else None).start()
        results: dict = {task: {s: [] for s in systems} for task in args.task}
        try:
            for task in args.task:
                for seed in args.seeds:  # systems interleaved seed by seed, so a busy moment costs all
                    for s in systems:
                        results[task][s].append(measure(s, task, seed, args, root, server))
        finally:
            server.stop()
    print(f"\n{args.trials} trials, {args.parallel} at a time (optuna: one at a time), TPE seeds {args.seeds}, "
          f"DeepPod's pruner {args.pruner} from step {args.prune_after}"
          + (f", its server offering {args.server_cpus} CPUs" if args.server_cpus else ""))
    print("| task (target) | system | time to target | whole search | best acc, full trials | epochs run |")
    print("| --- | --- | --- | --- | --- | --- |")
    for task, rs in results.items():
        for s, runs in rs.items():
            cell = lambda k, unit="s": " / ".join(fmt(r[k], unit) for r in runs)  # noqa: E731
            print(f"| {task} ({args.target or TARGETS[task]}) | {s} | {cell('to_target_s')} | {cell('search_s')} "
                  f"| {cell('best_full', '')} | {' / '.join(str(r['epochs']) for r in runs)} |")
    print("\nmedians over seeds (time to target counts a run that never reached it as the whole search):")
    for task, rs in results.items():
        med = {s: {k: median([(r[k] if r[k] is not None else r["search_s"]) if k == "to_target_s" else r[k]
                              for r in runs]) for k in ("to_target_s", "search_s", "best_full")}
               for s, runs in rs.items()}
        for s in systems[1:]:
            print(f"{task}: {s} vs optuna: time to target {med['optuna']['to_target_s'] / med[s]['to_target_s']:.2f}x,"
                  f" whole search {med['optuna']['search_s'] / med[s]['search_s']:.2f}x, best accuracy "
                  f"{med[s]['best_full']:.3f} vs {med['optuna']['best_full']:.3f}")
    print("\nper seed (each seed a round: every system once), time to target vs optuna:")
    for task, rs in results.items():
        for s in systems[1:]:
            ratios = [to_target(o) / to_target(r) for o, r in zip(rs["optuna"], rs[s])]
            print(f"  {task}: " + Spread.of(ratios).line(f"{s} / optuna", aim=3.0))
    print(meter.line())


def to_target(r: dict) -> float:
    """Seconds to the target; a run that never reached it counts its whole search."""
    return r["to_target_s"] if r["to_target_s"] is not None else r["search_s"]


if __name__ == "__main__":
    main()
