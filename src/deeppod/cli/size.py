"""``deeppod size``: GPUs, nodes, cores per GPU and storage for a described workload."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from deeppod.cli.common import JsonOpt
from deeppod.cli.output import console, print_json

app = typer.Typer()


@app.command("size")
def size(
    images: Annotated[int, typer.Option(help="images in the training dataset")],
    epochs: Annotated[float, typer.Option(help="epochs a run trains")],
    hours: Annotated[float, typer.Option(help="the time one run should take")],
    images_per_gpu: Annotated[float, typer.Option(help="training images/s one GPU sustains for the model "
                                                       "('deeppod bench train' measures it, or a published figure)")],
    image_kb: Annotated[float, typer.Option(help="mean stored image in KB (ImageNet's JPEGs: 110)")] = 110.0,
    users: Annotated[int, typer.Option(help="people submitting runs")] = 1,
    runs_per_user_day: Annotated[float, typer.Option(help="runs each submits a day")] = 1.0,
    wait_minutes: Annotated[float, typer.Option(help="the 95th-percentile wait for GPUs to stay under")] = 30.0,
    job_gpus: Annotated[Optional[int], typer.Option(help="GPUs a run uses (default: what meets --hours)")] = None,
    scaling: Annotated[float, typer.Option(help="data-parallel efficiency past one GPU")] = 0.9,
    inference_rps: Annotated[float, typer.Option(help="predictions a second to serve")] = 0.0,
    rps_per_gpu: Annotated[float, typer.Option(help="predictions a second one GPU serves")] = 0.0,
    gpus_per_node: int = 8,
    versions: Annotated[int, typer.Option(help="dataset versions kept")] = 3,
    simulate: Annotated[bool, typer.Option(help="replay the runs in the scheduler's simulator for the wait")] = True,
    as_json: JsonOpt = False,
) -> None:
    """How many GPUs, nodes, CPU cores per GPU, and how much storage throughput and capacity a
    workload needs, each with its reason (docs/scheduler.md, "Sizing")."""
    from deeppod.sizing import Workload
    from deeppod.sizing import size as recommend

    r = recommend(Workload(images=images, epochs=epochs, hours=hours, images_per_gpu=images_per_gpu,
                           image_kb=image_kb, users=users, runs_per_user_day=runs_per_user_day,
                           wait_minutes=wait_minutes, job_gpus=job_gpus, scaling=scaling,
                           inference_rps=inference_rps, rps_per_gpu=rps_per_gpu, gpus_per_node=gpus_per_node,
                           versions=versions, simulate=simulate))
    if as_json:
        return print_json(r.as_dict())
    console.print(f"GPUs: {r.gpus} ({r.training_gpus} training, {r.inference_gpus} serving) on {r.nodes} node(s) "
                  f"of {gpus_per_node}\nCPU cores per GPU: {r.cpus_per_gpu}\nstorage: {r.read_gb_s:g} GB/s read, "
                  f"{r.capacity_tb:g} TB\na run: {r.job_gpus} GPU(s), {r.run_hours:g} h", soft_wrap=True)
    if r.waits:
        console.print("simulated waits: " + ", ".join(f"{w['gpus']} GPUs: p95 {w['p95_wait_min']:g} min, mean "
                                                      f"{w['mean_wait_min']:g} min" for w in r.waits), soft_wrap=True)
    console.print("why:\n" + "\n".join(f"- {line}" for line in r.why), soft_wrap=True)
