"""Input pipeline: DeepPod's shard loader vs torchvision ImageFolder + DataLoader, and vs
NVIDIA DALI's fused CPU pipeline (decode only the crop), same JPEG files (about 500 px,
quality 90), same transforms (RandomResizedCrop(224) + horizontal flip), same number of
cores, in one run. Prints images/s per core and the ratios. Aims: >= 3x torchvision,
>= 1.3x DALI.

    python benchmarks/data_loader.py [--images 1500] [--workers 1,2] [--batch-size 64] [--epochs 2]
        [--rounds 3]
        [--dali-python PATH] [--decode-on cuda --device-workers 2,4]

--decode-on cuda adds DeepPod's GPU-decode path (the workers read bytes and draw crops,
nvJPEG decodes on the GPU, crop and resize there): images/s per GPU, with as many loader
processes as --device-workers says, beside the CPU paths on --workers cores.

DALI runs in its own environment (``python -m venv E && E/bin/pip install nvidia-dali-cuda120``;
it runs CPU-only with device_id=None): --dali-python names that Python. With one loader
process per core for DeepPod and torchvision, DALI gets one process with as many threads.

The baseline is what users write by hand: ImageFolder, Compose([RandomResizedCrop(224),
RandomHorizontalFlip(), ToTensor()]), DataLoader(batch_size, shuffle, num_workers).
Normalisation is left out of both (DeepPod does it on the device).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from pathlib import Path

from deeppod.bench.spread import LoadMeter, Spread, machine


def make_images(root: Path, n: int, classes: int = 10, seed: int = 0) -> None:
    """Photo-like JPEGs: smooth colour fields, shapes and sensor noise, 420-560 px sides."""
    import numpy as np
    from PIL import Image, ImageDraw, ImageFilter

    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    for i in range(n):
        w, h = rng.randint(420, 560), rng.randint(380, 520)
        yy, xx = np.mgrid[0:h, 0:w]
        base = np.stack([(np.sin(xx / rng.uniform(20, 90) + c) * np.cos(yy / rng.uniform(20, 90) - c) + 1) * 110
                         for c in range(3)], axis=-1)
        im = Image.fromarray(np.clip(base + nrng.normal(0, 12, base.shape), 0, 255).astype("uint8"))
        draw = ImageDraw.Draw(im)
        for _ in range(12):
            x, y = rng.randrange(w), rng.randrange(h)
            draw.ellipse((x, y, x + rng.randint(20, 160), y + rng.randint(20, 160)),
                         fill=tuple(rng.randrange(256) for _ in range(3)))
        im = im.filter(ImageFilter.GaussianBlur(0.6))
        d = root / f"class{i % classes:02d}"
        d.mkdir(parents=True, exist_ok=True)
        im.save(d / f"img{i:05d}.jpg", quality=90)


def build_shards(src: Path, out: Path) -> None:
    import tarfile

    from deeppod.datasets.ingest import Limits, build
    from deeppod.datasets.objects import ObjectStore
    from deeppod.datasets.policy import Policy

    tar_path = out.parent / "upload.tar"
    with tarfile.open(tar_path, "w") as tar:
        tar.add(src, arcname="data")
    build(tar_path, out, ObjectStore(out.parent / "objects"), Policy(), Limits(1 << 30, 1 << 40))
    tar_path.unlink()


def run_baseline(src: Path, workers: int, batch: int, epochs: int) -> tuple[float, int]:
    import torch
    from torchvision import datasets
    from torchvision import transforms as T

    ds = datasets.ImageFolder(str(src), T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                                                   T.ToTensor()]))
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                                         persistent_workers=True)
    return _time(loader, epochs)


def run_deeppod(version: Path, workers: int, batch: int, epochs: int, decode_on=None) -> tuple[float, int]:
    from deeppod.runtime.data import ImageDataset, loader

    ds = ImageDataset(version, split=None, size=224, train=True)
    order = list(range(len(ds)))

    class Epochs:  # a fresh shuffle each epoch, as the trainer does
        def __iter__(self):
            random.shuffle(order)
            return iter(order)

    return _time_fn(lambda: loader(ds, batch_size=batch, sampler=Epochs(), workers=workers, decode_on=decode_on),
                    epochs)


def run_dali(python: str, src: Path, workers: int, batch: int, epochs: int) -> float:
    import subprocess

    out = subprocess.run([python, str(Path(__file__).with_name("dali_pipeline.py")), str(src), str(workers), str(batch),
                          str(epochs)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["img_s"]


def _time(loader, epochs: int) -> tuple[float, int]:
    return _time_fn(lambda: loader, epochs)


def _time_fn(make, epochs: int) -> tuple[float, int]:
    # epoch 0 warms the page cache and starts the workers; the rest are timed
    n, began = 0, None
    for e in range(epochs + 1):
        if e == 1:
            began = time.perf_counter()
        for x, y in make():
            if e >= 1:
                n += len(y)
        if x.is_cuda:  # the device's work counts
            import torch

            torch.cuda.synchronize()
    return n / (time.perf_counter() - began), n


def measure(args, src: Path, version: Path, w: int) -> tuple[dict, str]:
    """One round at one core count: each system once, in turn."""
    base, _ = run_baseline(src, w, args.batch_size, args.epochs)
    ours, _ = run_deeppod(version, w, args.batch_size, args.epochs)
    row = {"workers": w, "baseline_img_s": round(base, 1), "deeppod_img_s": round(ours, 1),
           "baseline_per_worker": round(base / w, 1), "deeppod_per_worker": round(ours / w, 1),
           "ratio": round(ours / base, 3)}
    line = (f"cores {w}: torchvision ImageFolder {base:7.1f} img/s ({base / w:6.1f}/core) | "
            f"DeepPod {ours:7.1f} img/s ({ours / w:6.1f}/core) | {ours / base:.2f}x torchvision")
    if args.dali_python:
        dali = run_dali(args.dali_python, src, w, args.batch_size, args.epochs)
        row.update(dali_img_s=round(dali, 1), dali_per_worker=round(dali / w, 1), ratio_dali=round(ours / dali, 3))
        line += f" | DALI {dali:7.1f} img/s ({dali / w:6.1f}/core) | {ours / dali:.2f}x DALI"
    return row, line


def summarise(rounds: dict[int, list[dict]]) -> dict:
    """Per core count: each ratio's median and its worst and best rounds, against its aim."""
    out = {}
    print(f"\nover {len(next(iter(rounds.values())))} interleaved rounds (median, worst-best round):")
    for w, rows in rounds.items():
        out[w] = {}
        for key, what, aim in (("ratio", "DeepPod / torchvision", 3.0), ("ratio_dali", "DeepPod / DALI", 1.3)):
            if key in rows[0]:
                s = Spread.of([r[key] for r in rows])
                out[w][key] = s.as_dict() | {"aim": aim, "met": s.met(aim)}
                print(f"  cores {w}: " + s.line(what, aim=aim))
    return out


def device_decode(args, version: Path, results: list[dict]) -> list[dict]:
    import torch

    device = []
    name = torch.cuda.get_device_name() if args.decode_on.startswith("cuda") else args.decode_on
    for w in [int(x) for x in args.device_workers.split(",")]:
        rate, _ = run_deeppod(version, w, args.batch_size, args.epochs, decode_on=args.decode_on)
        device.append({"device": name, "workers": w, "deeppod_img_s": round(rate, 1)})
        best_cpu = max(results, key=lambda r: r["deeppod_img_s"])
        print(f"DeepPod decoding on {name}, {w} loader processes: {rate:7.1f} img/s | "
              f"{rate / best_cpu['deeppod_img_s']:.2f}x DeepPod on {best_cpu['workers']} cores | "
              f"= {rate / best_cpu['deeppod_per_worker']:.0f} cores of DeepPod's CPU decode | "
              f"{rate / max(r['baseline_per_worker'] for r in results):.0f} of torchvision's", flush=True)
    return device


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=1500)
    p.add_argument("--workers", default="1,2")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds: every system once per round")
    p.add_argument("--dir", default=None, help="keep the generated files here (default: a temp folder)")
    p.add_argument("--json", default=None)
    p.add_argument("--dali-python", default=None, help="a Python with nvidia-dali installed (its own venv)")
    p.add_argument("--decode-on", default=None, help="also measure decoding on this device (cuda)")
    p.add_argument("--device-workers", default="2,4", help="loader processes for the device-decode path")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    meter = LoadMeter()
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="deeppod-loader-"))
    src, version = work / "images", work / "version"
    if not src.exists():
        make_images(src, args.images)
    if not version.exists():
        build_shards(src, version)
    mean_kb = sum(f.stat().st_size for f in src.rglob("*.jpg")) / args.images / 1024
    print(machine())
    print(f"{args.images} JPEGs, mean {mean_kb:.0f} KB, batch {args.batch_size}, {args.rounds} rounds")
    rounds: dict[int, list[dict]] = {int(x): [] for x in args.workers.split(",")}
    for rnd in range(args.rounds):
        for w in rounds:
            row, line = measure(args, src, version, w)
            rounds[w].append(row)
            print(f"round {rnd + 1} {line}", flush=True)
    spread = summarise(rounds)
    print(meter.line())
    results = [rows[-1] for rows in rounds.values()]
    device = device_decode(args, version, results) if args.decode_on else []
    if args.json:
        Path(args.json).write_text(json.dumps({"images": args.images, "mean_kb": round(mean_kb), "machine": machine(),
                                               "other_cores": round(meter.cores(), 2), "rounds": rounds,
                                               "spread": spread, **({"device": device} if device else {})}, indent=1))
    if not args.dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
