"""Large models: memory per worker and throughput, DDP vs runtime.shard (FSDP2), one run.

    python benchmarks/large_model.py [--workers 2 4] [--width 768] [--layers 6] [--steps 4]

Every configuration trains the same transformer encoder (``--layers`` layers of width
``--width``, AdamW) on the same random data, each worker its own batch, for ``--steps``
timed steps after 2 warm ones:

- DDP (``DistributedDataParallel``): every worker holds the whole model, gradients and
  optimizer state;
- FSDP (``runtime.shard``): each holds 1/N of them, a layer's weights gathered while it runs;
- FSDP + activation checkpointing; FSDP + offload (on a GPU only: on CPU it is FSDP).

Peak memory per worker: on a GPU ``torch.cuda.max_memory_allocated``; on CPU the process's
resident high-water mark (``ru_maxrss``) less what it held before the model was built
(the interpreter, torch, the process group). Configurations take turns, each in fresh
processes; gloo on CPU, NCCL on GPUs. Aims (issue 42): FSDP's peak per worker <= 0.6x DDP's
at 2 workers and <= 0.35x at 4; FSDP's throughput >= 0.9x DDP's where both fit.
"""

from __future__ import annotations

import argparse
import json
import socket
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("ddp", "fsdp", "fsdp+ac", "fsdp+offload")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _local_mb(tensors) -> float:
    """What this worker holds of ``tensors`` (a shard's local part for a sharded one)."""
    total = 0
    for t in tensors:
        if t is None or not hasattr(t, "numel"):
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total / 2**20


def _worker(rank: int, world: int, port: int, config: str, a: dict, out: str) -> None:
    import resource

    import torch
    import torch.distributed as dist

    from deeppod.runtime.sharding import shard

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    else:
        torch.set_num_threads(max(1, a["threads"]))
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    before = _rss_mb()
    torch.manual_seed(0)
    # FSDP builds on the meta device, as docs/runtime.md tells a user to (runtime.shard then
    # materializes a layer at a time); --eager builds the whole model first, as DDP must
    with torch.device("meta" if config != "ddp" and not a["eager"] else "cpu"):
        layer = torch.nn.TransformerEncoderLayer(a["width"], a["width"] // 64, 4 * a["width"], dropout=0.0,
                                                 batch_first=True)
        model = torch.nn.TransformerEncoder(layer, a["layers"], enable_nested_tensor=False)
    params = sum(p.numel() for p in model.parameters())
    if config == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model.to(device),
                                                          device_ids=[device.index] if cuda else None)
    else:
        model = shard(model, activation_checkpointing=config == "fsdp+ac", offload=config == "fsdp+offload")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(a["batch"], a["seq"], a["width"], generator=torch.Generator().manual_seed(rank)).to(device)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(2 + a["steps"]):
        began = time.perf_counter()
        loss = model(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()
        if step >= 2:
            times.append(time.perf_counter() - began)
    peak = (torch.cuda.max_memory_allocated() / 2**20 if cuda
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before)
    held = _local_mb([*model.parameters(), *(p.grad for p in model.parameters()),
                      *(v for st in opt.state.values() for v in st.values())])
    got = [None] * world
    dist.all_gather_object(got, (peak, held))
    if rank == 0:
        Path(out).write_text(json.dumps({"peak_mb": max(g[0] for g in got), "state_mb": max(g[1] for g in got),
                                         "step_s": sorted(times)[len(times) // 2],
                                         "samples_per_s": world * a["batch"] / (sorted(times)[len(times) // 2]),
                                         "params": params}))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    import torch
    import torch.multiprocessing as mp

    from deeppod.bench.spread import LoadMeter, machine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--batch", type=int, default=2, help="sequences per worker and step")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--eager", action="store_true", help="FSDP too builds the whole model before sharding it")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "large_model.json")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    meter = LoadMeter()
    print(machine())
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for world in args.workers:
            if cuda and world > torch.cuda.device_count():
                print(f"{world} workers: skipped, {torch.cuda.device_count()} GPUs here")
                continue
            threads = 1 if cuda else max(1, (torch.get_num_threads() or 1) // world)
            for config in CONFIGS:
                out = f"{tmp}/{config}-{world}.json"
                a = {"width": args.width, "layers": args.layers, "batch": args.batch, "seq": args.seq,
                     "steps": args.steps, "threads": threads, "eager": args.eager}
                mp.start_processes(_worker, args=(world, free_port(), config, a, out), nprocs=world,
                                   start_method="spawn")
                r = json.loads(Path(out).read_text())
                results.setdefault(world, {})[config] = r
                print(f"{world} workers {config:13s} peak {r['peak_mb']:8.0f} MB per worker, "
                      f"holding {r['state_mb']:6.0f} MB of parameters, gradients and optimizer state  "
                      f"{r['samples_per_s']:7.2f} sequences/s  ({r['params'] / 1e6:.0f}M parameters)", flush=True)
    print("\n| workers | config | peak memory per worker | vs DDP | model state held | vs DDP | sequences/s | vs DDP |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for world, per in results.items():
        ddp = per["ddp"]
        for config, r in per.items():
            print(f"| {world} | {config} | {r['peak_mb']:.0f} MB | {r['peak_mb'] / ddp['peak_mb']:.2f}x | "
                  f"{r['state_mb']:.0f} MB | {r['state_mb'] / ddp['state_mb']:.2f}x | "
                  f"{r['samples_per_s']:.2f} | {r['samples_per_s'] / ddp['samples_per_s']:.2f}x |")
    for world, aim in ((2, 0.6), (4, 0.35)):
        if world in results:
            ratio = results[world]["fsdp"]["peak_mb"] / results[world]["ddp"]["peak_mb"]
            print(f"FSDP / DDP peak at {world} workers: {ratio:.2f}x (aim <= {aim}x: {'met' if ratio <= aim else 'NOT met'})")
    print(meter.line())
    args.out.write_text(json.dumps({"machine": machine(), "device": torch.cuda.get_device_name(0) if cuda else "cpu",
                                    "args": vars(args) | {"out": str(args.out)}, "results": results}, indent=1))
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
