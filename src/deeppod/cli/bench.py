"""Benchmarks from the command line: storage, inference, training."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from deeppod.cli.common import JsonOpt, TokenOpt, UrlOpt, client
from deeppod.cli.output import console, print_json
from deeppod.errors import InvalidRequest

app = typer.Typer()
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: training throughput, ...")
app.add_typer(bench_app, name="bench")


@bench_app.command("storage")
def bench_storage_cmd(
    dataset: Annotated[str | None, typer.Option(
        help="NAME or NAME@VERSION: staged on this host and read there")] = None,
    data: Annotated[Path | None, typer.Option(help="a dataset version folder instead")] = None,
    mode: Annotated[str, typer.Option(help="raw (bytes, as MLPerf Storage), loader (decode + crop) or both")] = "both",
    batch: Annotated[int, typer.Option(help="samples per accelerator step (resnet50 on H100: 400)")] = 400,
    compute: Annotated[float, typer.Option(help="seconds of compute per step (resnet50 on H100: 0.224)")] = 0.224,
    steps: int = 10,
    loader_workers: Annotated[int, typer.Option(help="loader processes per accelerator (loader mode)")] = 1,
    image_size: int = 224,
    threads: Annotated[int, typer.Option(help="threads for the raw read test")] = 4,
    out: Annotated[Path | None, typer.Option(help="also write the results here as JSON")] = None,
    url: UrlOpt = None, token: TokenOpt = None,
) -> None:
    """Accelerator utilisation with N emulated accelerators (largest N with AU >= 90%), and
    sequential/random read throughput of the data folder."""
    from deeppod.bench.storage import as_dicts, max_accelerators, read_throughput

    if (dataset is None) == (data is None):
        raise InvalidRequest("give --dataset NAME[@VERSION] or --data FOLDER")
    if mode not in ("raw", "loader", "both"):
        raise InvalidRequest(f"--mode {mode!r}: use raw, loader or both")
    folder = Path(client(url, token).datasets.stage(dataset)["path"]) if dataset else data
    if not (folder / "index.npy").is_file():
        raise InvalidRequest(f"{folder} is not a dataset version folder (no index.npy)")
    report = {"folder": str(folder), "batch": batch, "compute_s": compute, "steps": steps}
    io_ = read_throughput(folder, threads=threads)
    report["read"] = io_
    console.print(f"read {io_['bytes'] / 1e6:.1f} MB in {io_['files']} files with {threads} threads: sequential "
                  f"{io_['sequential_MBps']} MB/s, random {io_['random_block'] // 1024} KB reads "
                  f"{io_['random_MBps']} MB/s ({io_['random_iops']} IOPS)")
    for m in (("raw", "loader") if mode == "both" else (mode,)):
        console.print(f"{m}: emulated accelerators, batch {batch}, {compute} s compute per step")
        best, rows = max_accelerators(folder, mode=m, batch=batch, compute=compute, steps=steps,
                                      workers=loader_workers, size=image_size, echo=console.print)
        report[m] = {"max_accelerators_au90": best, "runs": as_dicts(rows)}
        console.print(f"{m}: largest N with AU >= 90%: {best}")
    if out:
        out.write_text(json.dumps(report, indent=1))


@bench_app.command("infer")
def bench_infer_cmd(
    deployment: Annotated[str, typer.Option(help="the deployment to load")],
    concurrency: Annotated[str, typer.Option(help="comma-separated numbers of concurrent clients")] = "1,8,32,64",
    duration: Annotated[float, typer.Option(help="seconds per concurrency level")] = 30.0,
    image: Annotated[Path | None, typer.Option(help="the image every request sends (default: a 224x224 JPEG)")] = None,
    baseline: Annotated[bool, typer.Option("--baseline/--no-baseline",
                                           help="also run a plain FastAPI + torch server with the same model")] = True,
    out: Annotated[Path | None, typer.Option(help="also write the results here as JSON")] = None,
    url: UrlOpt = None, token: TokenOpt = None,
) -> None:
    """Closed-loop load: throughput and p50/p99 latency per concurrency, beside the baseline."""
    import io

    from deeppod.bench.infer import compare

    try:
        levels = [int(x) for x in concurrency.split(",") if x.strip()]
    except ValueError:
        raise InvalidRequest(f"--concurrency {concurrency!r}: write numbers separated by commas, e.g. 1,8,32") from None
    if not levels or min(levels) < 1 or duration <= 0:
        raise InvalidRequest("--concurrency needs numbers of at least 1 and --duration more than 0")
    c = client(url, token)
    d = c.deployments.get(deployment)
    if image is not None:
        body = image.read_bytes()
    else:
        from PIL import Image

        buf = io.BytesIO()
        Image.effect_noise((224, 224), 64).convert("RGB").save(buf, "JPEG", quality=90)
        body = buf.getvalue()
    model_dir = c.models.version(f"{d['model']}@{d['version']}")["path"] if baseline else None
    console.print(f"{deployment}: {d['model']}@{d['version']}, {d['replicas']} replicas, batch {d['max_batch']} / "
                  f"{d['max_wait_ms']:g} ms; {len(body)}-byte image; {duration:g} s per level")
    rows = compare(d["predict_url"], {"Authorization": f"Bearer {c.token}"}, body, "image/jpeg", model_dir=model_dir,
                   concurrencies=levels, duration=duration, echo=console.print)
    if out:
        out.write_text(json.dumps({"deployment": d["name"], "model": f"{d['model']}@{d['version']}",
                                   "replicas": d["replicas"], "max_batch": d["max_batch"],
                                   "max_wait_ms": d["max_wait_ms"], **rows}, indent=1))


@bench_app.command("train")
def bench_train_cmd(
    model: str = "resnet50",
    batch_size: Annotated[int, typer.Option(help="per worker")] = 64,
    workers: int = 1,
    image_size: int = 224,
    steps: int = 20,
    synthetic: Annotated[bool, typer.Option("--synthetic", help="synthetic images (the only kind for now)")] = True,
    forward_only: Annotated[bool, typer.Option("--forward-only", help="inference only")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Training images/s per worker and in total, and scaling efficiency from 1 to N workers
    (AMP and channels_last on GPUs)."""
    from deeppod.bench.train import bench_train

    if workers < 1 or batch_size < 1 or steps < 1:
        raise InvalidRequest("--workers, --batch-size and --steps must be at least 1")
    r = bench_train(model, batch_size, workers, image_size, steps, forward_only)
    if as_json:
        print_json(r)
        return
    n = r["n_workers"]
    mode = "forward only" if forward_only else "training"
    console.print(f"{model} batch {batch_size}/worker, {image_size}px, {mode}")
    console.print(f"1 worker:  {r['one_worker']['images_per_second_total']:.1f} images/s")
    console.print(f"{n['workers']} workers: {n['images_per_second_total']:.1f} images/s in total, "
                  f"{n['images_per_second_per_worker']:.1f} per worker; scaling efficiency "
                  f"{r['scaling_efficiency']:.0%}")
    if "checkpoint_blocking_s" in n:
        console.print(f"checkpoint: {n['checkpoint_bytes'] / 1e6:.0f} MB, {n['checkpoint_blocking_s']:.2f} s blocking, "
                      f"{n['checkpoint_background_stall_s']:.3f} s stall in the background")
