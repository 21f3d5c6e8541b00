"""``deeppod size``: GPUs, nodes, cores per GPU and storage for a described workload."""

from __future__ import annotations

from typing import Annotated

import typer

from deeppod.cli.common import JsonOpt
from deeppod.cli.output import console, print_json, rows_table
from deeppod.errors import InvalidRequest

app = typer.Typer()


@app.command("size")
def size(
    images: Annotated[int, typer.Option(help="images in the training dataset")],
    epochs: Annotated[float, typer.Option(help="epochs a run trains")],
    hours: Annotated[float, typer.Option(help="the time one run should take")],
    images_per_gpu: Annotated[float | None, typer.Option(
        help="training images/s one GPU sustains for the model (a published figure, or --measure)")] = None,
    image_kb: Annotated[float, typer.Option(help="mean stored image in KB (ImageNet's JPEGs: 110)")] = 110.0,
    users: Annotated[int, typer.Option(help="people submitting runs")] = 1,
    runs_per_user_day: Annotated[float, typer.Option(help="runs each submits a day")] = 1.0,
    wait_minutes: Annotated[float, typer.Option(help="the 95th-percentile wait for GPUs to stay under")] = 30.0,
    job_gpus: Annotated[int | None, typer.Option(help="GPUs a run uses (default: what meets --hours)")] = None,
    scaling: Annotated[float, typer.Option(help="data-parallel efficiency past one GPU")] = 0.9,
    inference_rps: Annotated[float, typer.Option(help="predictions a second to serve")] = 0.0,
    rps_per_gpu: Annotated[float, typer.Option(help="predictions a second one GPU serves")] = 0.0,
    gpus_per_node: int = 8,
    versions: Annotated[int, typer.Option(help="dataset versions kept")] = 3,
    simulate: Annotated[bool, typer.Option(help="replay the runs in the scheduler's simulator for the wait")] = True,
    measure: Annotated[str | None, typer.Option(
        help="measure the per-GPU rate here instead: train this torchvision model (resnet50, ...) on "
             "synthetic images as 'deeppod bench train' does, on --measure-gpus workers")] = None,
    measure_gpus: Annotated[int | None, typer.Option(
        help="workers to measure on, one per GPU (default: this machine's GPUs; 2 or more also measure --scaling)")] \
        = None,
    measure_batch: Annotated[int, typer.Option(help="per-worker batch of the measurement")] = 64,
    measure_steps: Annotated[int, typer.Option(help="timed steps of the measurement")] = 20,
    as_json: JsonOpt = False,
) -> None:
    """How many GPUs, nodes, CPU cores per GPU, and how much storage throughput and capacity a
    workload needs, each with its reason (docs/scheduler.md, "Sizing")."""
    from deeppod.sizing import Workload
    from deeppod.sizing import size as recommend

    measured = None
    if measure is not None:
        images_per_gpu, scaling, measured = _measure(measure, measure_gpus, measure_batch, measure_steps, scaling)
    elif images_per_gpu is None:
        raise InvalidRequest("say how fast a GPU trains the model: --images-per-gpu N (a published figure), or "
                             "--measure MODEL to measure it here")
    r = recommend(Workload(images=images, epochs=epochs, hours=hours, images_per_gpu=images_per_gpu,
                           image_kb=image_kb, users=users, runs_per_user_day=runs_per_user_day,
                           wait_minutes=wait_minutes, job_gpus=job_gpus, scaling=scaling,
                           inference_rps=inference_rps, rps_per_gpu=rps_per_gpu, gpus_per_node=gpus_per_node,
                           versions=versions, simulate=simulate))
    if measured:
        r.why.insert(0, measured)
    if as_json:
        return print_json(r.as_dict())
    console.print(f"GPUs: {r.gpus} ({r.training_gpus} training, {r.inference_gpus} serving) on {r.nodes} node(s) "
                  f"of {gpus_per_node}\nCPU cores per GPU: {r.cpus_per_gpu}\nstorage: {r.read_gb_s:g} GB/s read, "
                  f"{r.capacity_tb:g} TB\na run: {r.job_gpus} GPU(s), {r.run_hours:g} h", soft_wrap=True)
    if r.waits:
        console.print("simulated waits for GPUs, by the cluster's size:")
        console.print(rows_table([{"gpus": w["gpus"], "p95 wait (min)": f"{w['p95_wait_min']:g}",
                                   "mean wait (min)": f"{w['mean_wait_min']:g}",
                                   "": "<- chosen" if w["gpus"] == r.training_gpus else ""} for w in r.waits],
                                 ["gpus", "p95 wait (min)", "mean wait (min)", ""]))
    console.print("why:\n" + "\n".join(f"- {line}" for line in r.why), soft_wrap=True)


def _measure(model: str, gpus: int | None, batch: int, steps: int, scaling: float) -> tuple[float, float, str]:
    """The per-GPU training rate (and, on 2 or more workers, the scaling efficiency) measured
    on this machine as ``deeppod bench train`` measures it; the line that says so."""
    import torch

    from deeppod.bench.train import bench_train

    here = torch.cuda.device_count()
    workers = gpus or max(1, here)
    if workers < 1 or batch < 1 or steps < 1:
        raise InvalidRequest("--measure-gpus, --measure-batch and --measure-steps must be at least 1")
    if here and workers > here:
        raise InvalidRequest(f"--measure-gpus {workers}: this machine has {here} GPU(s)")
    r = bench_train(model, batch, workers, 224, steps, False, checkpoint=False)
    rate = r["n_workers"]["images_per_second_per_worker"]
    if workers > 1:
        scaling = min(1.0, r["scaling_efficiency"])
    where = f"{workers} GPU(s)" if here else f"{workers} CPU worker(s): no GPU here, so a CPU worker's rate"
    line = f"measured here: {model}, batch {batch} per worker, 224 px, on {where}: {rate:,.1f} images/s per worker"
    return rate, scaling, line + (f", {scaling:.0%} scaling efficiency" if workers > 1 else "")
