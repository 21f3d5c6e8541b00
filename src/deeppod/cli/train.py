"""Built-in trainers: ``deeppod train image-classifier``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from deeppod.cli.common import TimeOpt, TokenOpt, UrlOpt, client
from deeppod.cli.jobs import follow_job, warn_never_fits
from deeppod.cli.output import console
from deeppod.cli.values import exported_env, parse_memory, parse_time_limit, parse_workers
from deeppod.errors import InvalidRequest
from deeppod.runtime.trainers.command import check_args, image_classifier

app = typer.Typer()
train_app = typer.Typer(no_args_is_help=True, help="Built-in trainers: no code needed.")
app.add_typer(train_app, name="train")


@train_app.command("image-classifier", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def train_image_classifier(
    ctx: typer.Context,
    data: Annotated[Path | None, typer.Option(help="class-per-folder image directory")] = None,
    dataset: Annotated[str | None,
                       typer.Option(help="a DeepPod dataset, NAME or NAME@VERSION (see 'deeppod data ls')")] = None,
    model: Annotated[str, typer.Option(help="torchvision model (resnet18, resnet50, ...), small-cnn, or auto: "
                                            "resnet18 on a GPU, small-cnn on CPU")] = "auto",
    epochs: int = 10,
    batch_size: Annotated[int | None, typer.Option(
        help="global batch (default: 128, less on a dataset where that makes an epoch under 4 steps)",
        show_default=False)] = None,
    lr: float = 0.1,
    optimizer: Annotated[str, typer.Option(
        help="sgd, momentum, nesterov, adam, adamw, adagrad, adadelta, rmsprop")] = "momentum",
    momentum: float = 0.9,
    weight_decay: float = 1e-4,
    image_size: Annotated[int | None, typer.Option(
        help="input size in pixels, square (default: the images' own, 16 to 224)", show_default=False)] = None,
    register: Annotated[str | None, typer.Option(
        help="register the trained model as a new version of model NAME when training ends")] = None,
    register_at_chance: Annotated[bool, typer.Option(
        "--register-at-chance",
        help="register it even when its validation accuracy is no better than chance (1 / classes); without it "
             "such a model stays in the job's folder")] = False,
    workers: Annotated[str, typer.Option("--workers", "-n", help="N or MIN:MAX")] = "1",
    gpus_per_worker: Annotated[int | None, typer.Option(
        help="GPUs per worker (default: 1 when the cluster has GPUs, else 0)", show_default=False)] = None,
    memory: Annotated[str | None, typer.Option(
        help="memory per worker, e.g. 4G (enforced): the strategy follows from it (--strategy auto), and a job "
             "that cannot fit is refused with the estimate")] = None,
    gpu_memory: Annotated[str | None, typer.Option(
        help="the memory each GPU must have, e.g. 40G: the strategy follows from it, and the job runs only on such "
             "GPUs (default: the estimate, and the strategy that fits the cluster's largest GPUs)",
        show_default=False)] = None,
    strategy: Annotated[str, typer.Option(
        help="auto, ddp (every worker the whole model) or fsdp (sharded: a model larger than one worker); "
             "auto: the cheapest that fits --memory, or the GPUs' memory (ddp where nothing says)")] = "auto",
    name: str | None = None,
    max_restarts: int = 3,
    grace: Annotated[float | None, typer.Option(
        help="seconds between SIGTERM and SIGKILL on a stop, cancel, preemption or shrink: the time the trainer "
             "has to save its checkpoint (default: the server's, 30 s)", show_default=False)] = None,
    time: TimeOpt = None,
    follow: Annotated[bool, typer.Option("--follow", "-f")] = False,
    url: UrlOpt = None, token: TokenOpt = None,
) -> None:
    """Train an image classifier on your images; more options (--lr-schedule, --loader-workers,
    --finetune-from, --scale-rule, --amp, ...: 'python -m deeppod.runtime.trainers.image_classifier
    --help') pass through to the trainer and are checked before the job is submitted."""
    if (data is None) == (dataset is None):
        raise InvalidRequest("give the images with either --dataset NAME[@VERSION] or --data FOLDER")
    if data is not None and not data.is_dir():
        raise InvalidRequest(f"--data {data} is not a folder of class folders")
    source = ["--data", str(data.resolve())] if data is not None else ["--dataset", dataset]
    args = [*source, "--model", model, "--epochs", str(epochs),
            *(["--batch-size", str(batch_size)] if batch_size else []), "--lr", str(lr),
            "--optimizer", optimizer, "--momentum", str(momentum), "--weight-decay", str(weight_decay),
            *(["--image-size", str(image_size)] if image_size else []), *(["--register", register] if register else []),
            *(["--register-at-chance"] if register_at_chance else []), *ctx.args]
    if strategy not in ("auto", "ddp", "fsdp"):
        raise InvalidRequest(f"--strategy {strategy!r}: use auto, ddp or fsdp")
    args += ["--strategy", strategy] if strategy != "auto" else []
    check_args(args, model)
    low, high = parse_workers(workers)
    memory_mb, gpu_memory_mb = parse_memory(memory), parse_memory(gpu_memory)
    c = client(url, token)  # an unknown dataset or version is refused by the server with the choices
    args, gpu_memory_mb = _sized(c, args, low, gpus_per_worker, memory_mb, gpu_memory_mb)
    command = image_classifier(args)
    job = c.jobs.submit(command, name=name or (f"train-{model}" if model != "auto" else "train-classifier"),
                        workers=low, max_workers=high,
                        gpus_per_worker=gpus_per_worker, memory_mb_per_worker=memory_mb, gpu_memory_mb=gpu_memory_mb,
                        max_restarts=max_restarts, grace_seconds=grace, time_limit_seconds=parse_time_limit(time),
                        own_folder=True,
                        env=exported_env(), stop_rules=[{"kind": "nan", "metric": "loss"}],
                        datasets=[dataset] if dataset else None)
    console.print(f"job {job['id']} ({job['name']}) submitted: follow it with 'deeppod logs {job['id']} -f' "
                  f"and 'deeppod metrics {job['id']} -f'")
    warn_never_fits(job)
    if follow:
        follow_job(c, job["id"])


def _sized(c, args: list[str], workers: int, gpus_per_worker: int | None, memory_mb: int | None,
           gpu_memory_mb: int | None) -> tuple[list[str], int | None]:
    """The trainer's options with the strategy that fits the memory it will have (runtime/trainers/
    memory.py), said on the terminal, and the GPU memory the job asks of each GPU."""
    from deeppod.runtime.trainers.memory import gpu_request, plan

    gpus, largest = _gpus(c, gpus_per_worker)
    if gpu_memory_mb is not None and not gpus:
        raise InvalidRequest("--gpu-memory is for GPU workers: the job gets no GPU (give --gpus-per-worker)")
    if gpus:
        # each GPU holds the model (and with --offload what is gathered for a step): the estimate is
        # what the job asks of every GPU, so it is placed only where it fits
        args, estimate, gpu_memory_mb = gpu_request(args, workers, largest_mb=largest, asked_mb=gpu_memory_mb)
        if estimate is not None:
            console.print(f"GPU memory: {estimate.text()}")
    if memory_mb is not None and (not gpus or largest is None or "--offload" in args):
        # the model lives in host memory (no GPU, logical slots that stand for none, or offloaded): what a
        # worker needs is known now
        args, estimate = plan(args, memory_mb, workers)
        console.print(f"memory: {estimate.text()}")
    return args, gpu_memory_mb


def _gpus(c, gpus_per_worker: int | None) -> tuple[int, int | None]:
    """The GPUs each worker will get (as the server's default picks them when not given), and
    the memory of the cluster's largest GPUs (None where a node's GPUs do not say: logical slots)."""
    nodes = [n for n in c.nodes() if n["healthy"] and n.get("up", True)]
    with_gpus = [n for n in nodes if any(g.get("healthy", True) for g in n["gpus"])]
    gpus = gpus_per_worker if gpus_per_worker is not None else (1 if with_gpus else 0)
    sizes = [n.get("gpu_memory_mb", 0) for n in with_gpus]
    return gpus, (max(sizes) if sizes and 0 not in sizes else None)
