"""Large models: memory per worker and throughput, DDP vs runtime.shard (FSDP2), one run.

    python benchmarks/large_model.py [--workers 2 4] [--width 768] [--layers 6] [--steps 4] [--rounds 2]

Every configuration trains the same transformer encoder (``--layers`` layers of width
``--width``, AdamW) on the same random data, each worker its own batch, for ``--steps``
timed steps after 2 warm ones:

- DDP (``DistributedDataParallel``): every worker holds the whole model, gradients and
  optimizer state;
- FSDP (``runtime.shard``, the model built on the meta device): each holds 1/N of them, a
  layer's weights gathered while it runs;
- FSDP + activation checkpointing; FSDP + offload (on a GPU only: on CPU it is FSDP).

Peak memory per worker: on a GPU ``torch.cuda.max_memory_allocated``. On CPU the process's
resident high-water mark above a warmed-up worker: each worker first trains the same layers
at width 64 for a step with the same strategy (loading the libraries, their code pages and
the strategy's one-time allocations, which a GPU's allocated bytes leave out too), then the
mark is reset (Linux's ``clear_refs``) and the real model built. "From cold" is the mark
above the process before that warm-up (the interpreter, torch and the process group only).
Configurations take turns, each in fresh processes, every one once per round; the ratios
to DDP are given with their median and their worst and best rounds. gloo on CPU, NCCL on
GPUs. Aims (issue 42): FSDP's peak per worker <= 0.6x DDP's at 2 workers and <= 0.35x at
4; FSDP's throughput >= 0.9x DDP's where both fit.
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


def _status_mb(field: str) -> float:
    """A memory line of /proc/self/status (VmRSS, VmHWM) in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
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


def _reset_peak() -> float:
    """The resident high-water mark set to what the process holds now (Linux's clear_refs 5);
    returns that."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_mb("VmHWM")


def _build(config: str, a: dict, device, cuda: bool, *, width: int, layers: int):
    import torch

    from deeppod.runtime.sharding import shard

    torch.manual_seed(0)
    # FSDP builds on the meta device, as docs/runtime.md tells a user to (runtime.shard then
    # materializes a layer at a time); --eager builds the whole model first, as DDP must
    with torch.device("meta" if config != "ddp" and not a["eager"] else "cpu"):
        layer = torch.nn.TransformerEncoderLayer(width, max(1, width // 64), 4 * width, dropout=0.0,
                                                 batch_first=True)
        model = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
    if config == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model.to(device),
                                                          device_ids=[device.index] if cuda else None)
    else:
        model = shard(model, activation_checkpointing=config == "fsdp+ac", offload=config == "fsdp+offload")
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def _step(model, opt, x, cuda: bool) -> None:
    import torch

    # DDP computes in bf16 on a GPU as FSDP's mixed precision does (and as the trainer's AMP
    # does): the comparison is of the strategies, not of fp32 against bf16
    sharded = hasattr(model, "unshard")
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda and not sharded):
        loss = model(x).float().pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if cuda:
        torch.cuda.synchronize()


def _worker(rank: int, world: int, port: int, config: str, a: dict, out: str) -> None:
    import resource

    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    else:
        torch.set_num_threads(max(1, a["threads"]))
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    cold = _status_mb("VmRSS")
    # the same layers at width 64, one step, first: the libraries, their code pages and the
    # strategy's one-time allocations (FSDP's first fully_shard alone: 36 MB) are the worker's,
    # not the model's; a GPU's allocated bytes leave them out likewise
    model, opt = _build(config, a, device, cuda, width=64, layers=1)
    _step(model, opt, torch.randn(a["batch"], a["seq"], 64).to(device), cuda)
    del model, opt
    before = _reset_peak()
    model, opt = _build(config, a, device, cuda, width=a["width"], layers=a["layers"])
    params = sum(p.numel() for p in model.parameters())
    x = torch.randn(a["batch"], a["seq"], a["width"], generator=torch.Generator().manual_seed(rank)).to(device)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(2 + a["steps"]):
        began = time.perf_counter()
        _step(model, opt, x, cuda)
        dist.barrier()
        if step >= 2:
            times.append(time.perf_counter() - began)
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else _status_mb("VmHWM") - before
    cold_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - cold
    held = _local_mb([*model.parameters(), *(p.grad for p in model.parameters()),
                      *(v for st in opt.state.values() for v in st.values())])
    got = [None] * world
    dist.all_gather_object(got, (peak, held, cold_peak))
    if rank == 0:
        Path(out).write_text(json.dumps({"peak_mb": max(g[0] for g in got), "state_mb": max(g[1] for g in got),
                                         "cold_peak_mb": max(g[2] for g in got),
                                         "step_s": sorted(times)[len(times) // 2],
                                         "samples_per_s": world * a["batch"] / (sorted(times)[len(times) // 2]),
                                         "params": params}))
    dist.barrier()
    dist.destroy_process_group()
    # leave without the interpreter's teardown, as the runtime does: with a gloo thread still in
    # native code, teardown aborted rank 1 once under load (SIGABRT, "terminate called without
    # an active exception") after it had done everything (runtime/stop.exit_process)
    from deeppod.runtime.stop import exit_process

    exit_process(0)


def main() -> None:
    import torch
    import torch.multiprocessing as mp

    from deeppod.bench.spread import LoadMeter, Spread, machine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--batch", type=int, default=2, help="sequences per worker and step")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2, help="every configuration once per round, interleaved")
    ap.add_argument("--eager", action="store_true", help="FSDP too builds the whole model before sharding it")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS, help="ddp first: the others "
                                                                                          "are compared with it")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "large_model.json")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    meter = LoadMeter()
    print(machine())
    worlds = [w for w in args.workers if not cuda or w <= torch.cuda.device_count()]
    for w in sorted(set(args.workers) - set(worlds)):
        print(f"{w} workers: skipped, {torch.cuda.device_count()} GPUs here")
    runs: dict = {}  # world -> config -> [one result per round]
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            for world in worlds:
                threads = 1 if cuda else max(1, (torch.get_num_threads() or 1) // world)
                for config in args.configs:
                    out = f"{tmp}/{config}-{world}-{rnd}.json"
                    a = {"width": args.width, "layers": args.layers, "batch": args.batch, "seq": args.seq,
                         "steps": args.steps, "threads": threads, "eager": args.eager}
                    mp.start_processes(_worker, args=(world, free_port(), config, a, out), nprocs=world,
                                       start_method="spawn")
                    r = json.loads(Path(out).read_text())
                    runs.setdefault(world, {}).setdefault(config, []).append(r)
                    print(f"round {rnd + 1}: {world} workers {config:13s} peak {r['peak_mb']:6.0f} MB per worker "
                          f"(from cold {r['cold_peak_mb']:5.0f}), holding {r['state_mb']:5.0f} MB of parameters, "
                          f"gradients and optimizer state, {r['samples_per_s']:6.2f} sequences/s "
                          f"({r['params'] / 1e6:.0f}M parameters)", flush=True)
    print("\n| workers | config | peak per worker | vs DDP | from cold | vs DDP | state held | vs DDP "
          "| sequences/s | vs DDP |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    summary: dict = {}
    for world, per in runs.items():
        ddp = per["ddp"]
        for config, rs in per.items():
            def ratio(key, rs=rs):
                return Spread.of([r[key] / d[key] for r, d in zip(rs, ddp)])

            def median(key, rs=rs):
                return sorted(r[key] for r in rs)[len(rs) // 2]

            peak, cold, held, speed = (ratio(k) for k in ("peak_mb", "cold_peak_mb", "state_mb", "samples_per_s"))
            summary.setdefault(world, {})[config] = {"peak": peak.as_dict(), "cold_peak": cold.as_dict(),
                                                      "held": held.as_dict(), "speed": speed.as_dict()}
            print(f"| {world} | {config} | {median('peak_mb'):.0f} MB | {peak} | {median('cold_peak_mb'):.0f} MB | "
                  f"{cold.median:.2f}x | {median('state_mb'):.0f} MB | {held.median:.2f}x | "
                  f"{median('samples_per_s'):.2f} | {speed} |")
    for world, aim in ((2, 0.6), (4, 0.35)):
        if world in runs:
            print(Spread.of([r["peak_mb"] / d["peak_mb"] for r, d in zip(runs[world]["fsdp"], runs[world]["ddp"])])
                  .line(f"FSDP / DDP peak memory per worker at {world} workers", aim=aim, higher_is_better=False))
    for world in runs:
        print(Spread.of([r["samples_per_s"] / d["samples_per_s"] for r, d in zip(runs[world]["fsdp"],
                                                                                 runs[world]["ddp"])])
              .line(f"FSDP / DDP throughput at {world} workers", aim=0.9))
    print(meter.line())
    args.out.write_text(json.dumps({"machine": machine(), "device": torch.cuda.get_device_name(0) if cuda else "cpu",
                                    "args": vars(args) | {"out": str(args.out)}, "runs": runs,
                                    "summary": summary, "load": meter.line()}, indent=1))
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
