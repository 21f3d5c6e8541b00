"""``deeppod tune``: hyperparameter search experiments whose trials are ordinary jobs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from deeppod.cli.common import JsonOpt, TokenOpt, UrlOpt, client
from deeppod.cli.output import console, print_json, rows_table
from deeppod.cli.spec import SpecOpt, inline, inline_requirements, read_yaml
from deeppod.cli.values import (
    exported_env,
    parse_env,
    parse_memory,
    parse_time_limit,
    parse_workers,
    read_requirements,
)
from deeppod.errors import InvalidRequest
from deeppod.runtime.trainers import command as trainer

app = typer.Typer(no_args_is_help=True, help="Hyperparameter search: trials run as your jobs on the shared GPUs.")

# the built-in trainer's default space: what most image classifiers are tuned on
# Where SGD with momentum trains the built-in models well in a few epochs (measured on digits:
# 3 epochs at lr 0.05-0.1, batch 32, reach 58-73% where lr 0.3 with adamw stays at chance);
# adamw wants a 30x smaller lr, which one shared lr range cannot give both.
IMAGE_CLASSIFIER_SPACE = {
    "lr": {"type": "float", "low": 0.01, "high": 0.2, "log": True},
    "momentum": {"type": "float", "low": 0.85, "high": 0.95},
    "weight_decay": {"type": "float", "low": 1e-5, "high": 1e-3, "log": True},
    "batch_size": {"type": "categorical", "choices": [32, 64]},
    "optimizer": {"type": "categorical", "choices": ["momentum", "nesterov"]},
}
TRAINER_FLAGS = {"lr": "--lr", "momentum": "--momentum", "weight_decay": "--weight-decay", "batch_size": "--batch-size",
                 "optimizer": "--optimizer", "epochs": "--epochs", "warmup_epochs": "--warmup-epochs",
                 "image_size": "--image-size", "model": "--model"}

Space = Annotated[Path | None, typer.Option("--space", help="the search space, a YAML file")]
Metric = Annotated[str, typer.Option(help="the value your script reports with runtime.report(step, NAME=...)")]
Mode = Annotated[str, typer.Option(help="max or min")]
Trials = Annotated[int, typer.Option(help="trials in all (the budget)")]
Parallel = Annotated[int, typer.Option(help="at most this many at once (fewer when GPUs are busy)")]
Sampler = Annotated[str, typer.Option(help="tpe, random, grid or cmaes")]
Pruner = Annotated[str,
                   typer.Option(help="asha, asha-promote (pauses trials at a rung; with --reuse), hyperband, median "
                                "or none")]
PruneAfter = Annotated[int, typer.Option(help="the first reported step (epoch) at which the pruner may stop a trial: "
                                              "asha's first rung (then 3x, 9x, ...); raise it where the first "
                                              "epochs say little of the last")]
Register = Annotated[str | None, typer.Option(help="register the best trial's model as a version of model NAME")]
AtChance = Annotated[bool, typer.Option("--register-at-chance", help="register it even when its accuracy is no "
                                                                     "better than chance (1 / classes)")]
Reuse = Annotated[bool, typer.Option("--reuse", help="a trial's process runs the next trial when the script loops "
                                                     "over runtime.trials(): torch imported and data loaded once")]


def read_space(path: Path) -> dict:
    return check_space(read_yaml(path, f"the space file {path}"), f"the space file {path}")


def check_space(raw, where: str) -> dict:
    if not isinstance(raw, dict) or not raw:
        raise InvalidRequest(f"{where} must hold a mapping of parameters, e.g. "
                             "lr: {type: float, low: 0.0001, high: 0.1, log: true}")
    return raw


@app.command("create")
def create(
    ctx: typer.Context,
    name: str,
    command: Annotated[list[str], typer.Argument(help="each trial's command after '--', with {param} placeholders")],
    space: Space = None, metric: Metric = "val_acc", mode: Mode = "max", trials: Trials = 20,
    parallel: Parallel = 4, sampler: Sampler = "tpe", pruner: Pruner = "asha", prune_after: PruneAfter = 1,
    seed: int | None = None, register: Register = None, register_at_chance: AtChance = False, reuse: Reuse = False,
    workers: Annotated[str, typer.Option("--workers", "-n", help="workers per trial: N or MIN:MAX")] = "1",
    gpus_per_worker: Annotated[int | None, typer.Option(help="default: 1 when the cluster has GPUs, else 0",
                                                           show_default=False)] = None,
    cpus_per_worker: Annotated[float | None, typer.Option(show_default=False)] = None,
    memory: Annotated[str | None, typer.Option(help="memory per worker, e.g. 4G")] = None,
    gpu_memory: Annotated[str | None, typer.Option(
        help="the memory each GPU of a trial must have, e.g. 40G (as submit's)", show_default=False)] = None,
    env: Annotated[list[str], typer.Option("--env", "-e", help="KEY=VALUE for every trial (repeatable)")] = [],  # noqa: B006
    dataset: Annotated[list[str], typer.Option("--dataset", help="NAME or NAME@VERSION, staged for every trial")] = [],  # noqa: B006
    workdir: Annotated[Path | None, typer.Option(help="a folder on the server to run in (default: as submit)")] = None,
    code: Annotated[Path | None, typer.Option(help="send this folder; every trial runs in its own copy")] = None,
    requirements: Annotated[Path | None, typer.Option(
        help="a requirements.txt: every trial runs in the Python environment built from it (built once)",
        show_default=False)] = None,
    python: Annotated[str | None, typer.Option(help="its environment's Python, e.g. 3.12", show_default=False)] = None,
    image: Annotated[str | None, typer.Option(help="a container image the server offers: every trial runs in it",
                                                 show_default=False)] = None,
    time: Annotated[str | None, typer.Option(
        "--time", help="each trial's longest run, e.g. 30m or 2h: a trial that reaches it is stopped (it "
                       "checkpoints) and its last reported value counts (on Slurm: each trial's --time)",
        show_default=False)] = None,
    max_restarts: int = 0, spec: SpecOpt = None, as_json: JsonOpt = False, url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Search hyperparameters: deeppod tune create lr-search --space space.yaml --metric val_acc
    --trials 40 --parallel 4 -- python train.py --lr {lr} --batch-size {batch_size}
    (or: deeppod tune create lr-search --spec search.yaml, the space a mapping in it)"""
    if space is None and inline(ctx, "space") is None:
        raise InvalidRequest("give the search space with --space FILE.yaml, e.g. "
                             "lr: {type: float, low: 0.0001, high: 0.1, log: true}")
    low, high = parse_workers(workers)
    c = client(url, token)
    exp = c.experiments.create(
        name, command, space=read_space(space) if space else check_space(inline(ctx, "space"), "--spec's space"),
        metric=metric, mode=mode, trials=trials, parallel=parallel,
        sampler=sampler, pruner=pruner, prune_after=prune_after, seed=seed, register=register,
        register_at_chance=register_at_chance, reuse=reuse, workers=low, max_workers=high,
        gpus_per_worker=gpus_per_worker, cpus_per_worker=cpus_per_worker, memory_mb_per_worker=parse_memory(memory),
        gpu_memory_mb=parse_memory(gpu_memory), env={**exported_env(), **parse_env(env)}, datasets=dataset or None,
        workdir=str(workdir.resolve()) if workdir else None, code=code, max_restarts=max_restarts,
        requirements=read_requirements(requirements) if requirements else inline_requirements(ctx), python=python,
        image=image, time_limit_seconds=parse_time_limit(time))
    _created(exp, as_json)


@app.command("image-classifier", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def image_classifier(
    ctx: typer.Context,
    name: str,
    dataset: Annotated[str | None, typer.Option(help="a DeepPod dataset, NAME or NAME@VERSION")] = None,
    data: Annotated[Path | None, typer.Option(help="or a class-per-folder image directory on the server")] = None,
    space: Annotated[Path | None, typer.Option(
        help="a YAML search space over the trainer's options (default: lr, momentum, weight decay, batch size, "
             "optimizer)")] = None,
    model: Annotated[str,
                     typer.Option(help="small-cnn, a torchvision model, or auto (resnet18 on a GPU)")] = "small-cnn",
    epochs: int = 10,
    image_size: Annotated[int | None, typer.Option(help="default: the images' own", show_default=False)] = None,
    metric: Metric = "val_accuracy", trials: Trials = 20, parallel: Parallel = 4, sampler: Sampler = "tpe",
    pruner: Pruner = "asha", prune_after: PruneAfter = 1, seed: int | None = None, register: Register = None,
    register_at_chance: AtChance = False, gpus_per_worker: Annotated[int | None,
                                                                     typer.Option(show_default=False)] = None,
    as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None,
) -> None:
    """Tune the built-in image classifier: no code needed. Extra options (--amp, --lr-schedule,
    ...) pass through to every trial."""
    if (data is None) == (dataset is None):
        raise InvalidRequest("give the images with either --dataset NAME[@VERSION] or --data FOLDER")
    chosen = read_space(space) if space is not None else dict(IMAGE_CLASSIFIER_SPACE)
    unknown = sorted(set(chosen) - set(TRAINER_FLAGS))
    if unknown:
        raise InvalidRequest(f"the built-in trainer has no option for {', '.join(unknown)}: "
                             f"tune {', '.join(sorted(TRAINER_FLAGS))}")
    fixed = {k: v for k, v in {"model": model, "epochs": epochs, "image_size": image_size}.items() if v is not None}
    args = ["--data", str(data.resolve())] if data is not None else ["--dataset", dataset]
    args += ["--val-step", "epoch"]  # the pruner's rungs in epochs: batch sizes in the space train unequally per step
    for key, flag in TRAINER_FLAGS.items():
        if key in chosen:
            args += [flag, "{" + key + "}"]
        elif key in fixed:
            args += [flag, str(fixed[key])]
    trainer.check_args([*[_example(a, chosen) for a in args], *ctx.args], model)
    command = trainer.image_classifier([*args, *ctx.args])
    c = client(url, token)
    exp = c.experiments.create(name, command, space=chosen, metric=metric, mode="max", trials=trials,
                              parallel=parallel, sampler=sampler, pruner=pruner, prune_after=prune_after, seed=seed,
                              register=register,
                              register_at_chance=register_at_chance,
                              gpus_per_worker=gpus_per_worker, own_folder=True, env=exported_env(),
                              datasets=[dataset] if dataset else None, max_restarts=3,
                              stop_rules=[{"kind": "nan", "metric": "loss"}])
    _created(exp, as_json)


def _example(arg: str, space: dict) -> str:
    """A placeholder's stand-in for checking the trainer's options: its first choice or low end."""
    spec = space.get(arg[1:-1]) if arg.startswith("{") and arg.endswith("}") else None
    if not isinstance(spec, dict):
        return arg
    if "choices" in spec and spec["choices"]:
        return str(spec["choices"][0])
    return str(spec.get("low", arg))


def _created(exp: dict, as_json: bool) -> None:
    if as_json:
        print_json(exp)
        return
    console.print(f"experiment {exp['name']} started: {exp['trials']} trials, at most {exp['parallel']} at once "
                  f"({exp['sampler']} sampler, {exp['pruner']} pruner); follow it with 'deeppod tune show "
                  f"{exp['name']}'")


@app.command("ls")
def ls(as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Your tenant's experiments (admins: all)."""
    rows = client(url, token).experiments()
    if as_json:
        print_json(rows)
        return
    console.print(rows_table([{
        "name": e["name"], "tenant": e["tenant"], "state": e["state"],
        "trials": f"{sum(e['counts'].values())}/{e['trials']}",
        "running": e["counts"].get("running", 0), "pruned": e["counts"].get("pruned", 0),
        "metric": f"{e['metric']} ({e['mode']})", "best": _num(e["best_value"])} for e in rows],
        ["name", "tenant", "state", "trials", "running", "pruned", "metric", "best"]))


def _num(v) -> str:
    return "-" if v is None else f"{v:.4g}"


def render_show(e: dict) -> None:
    console.print(f"[bold]{e['name']}[/] ({e['tenant']}/{e['user']}): {e['state']}"
                  + (f", {e['reason']}" if e["reason"] else ""))
    console.print(f"{e['metric']} ({e['mode']}), {e['sampler']} sampler, {e['pruner']} pruner"
                  + (f" from step {e['prune_after']}" if e.get("prune_after", 1) != 1 and e["pruner"] != "none" else "")
                  + f", {sum(e['counts'].values())} of {e['trials']} trials, at most {e['parallel']} at once")
    names = sorted(e["space"])
    rows = []
    for t in e.get("trial_table") or []:
        row = {"trial": t["number"], "job": t["job_id"], "state": t["state"], "value": _num(t["value"]),
               "peak": _num(t["best"]), "step": t["step"] if t["step"] >= 0 else "-"}
        row.update({n: _fmt(t["params"].get(n)) for n in names})
        rows.append(row)
    # value: the trial's final report, what its model scores and what "best" ranks; peak: its
    # highest report along the way; step: the last step it reported, as the pruner counts them
    # (the built-in trainer reports epochs from 1) (docs/tune.md)
    console.print(rows_table(rows, ["trial", "job", "state", *names, "value", "peak", "step"]))
    if e["best_trial"] is not None and e["best_value"] is not None:
        params = ", ".join(f"{k}={_fmt(v)}" for k, v in (e["best_params"] or {}).items())
        console.print(f"best: trial {e['best_trial']}, {e['metric']} {e['best_value']:.4g} ({params})"
                      + (f"; model {e['registered']}" if e["registered"] else ""))


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


@app.command("show")
def show(name: str, follow: Annotated[bool, typer.Option("--follow", "-f", help="refresh until it ends")] = False,
         tenant: Annotated[str | None, typer.Option(help="another tenant's (admins)")] = None,
         as_json: JsonOpt = False, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """The trials table (params, state, final value, peak, last step) and the best trial (by final value)."""
    c = client(url, token)
    e = c.experiments.get(name, tenant)
    if as_json:
        print_json(e)
        return
    render_show(e)
    while follow and e["state"] in ("running", "stopping"):
        time.sleep(5)
        e = c.experiments.get(name, tenant)
        console.rule()
        render_show(e)


@app.command("stop")
def stop(name: str, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """No new trials; running trials checkpoint and stop (resume continues them)."""
    e = client(url, token).experiments.stop(name)
    console.print(f"experiment {e['name']}: {e['state']}")


@app.command("resume")
def resume(name: str, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Continue a stopped experiment: its stopped trials from their checkpoints, then new ones."""
    e = client(url, token).experiments.resume(name)
    console.print(f"experiment {e['name']}: {e['state']}")
