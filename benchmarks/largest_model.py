"""The largest model that trains on one GPU, with and without offload (issue 42).

    python benchmarks/largest_model.py [--width 4096] [--seq 2048] [--caps full 79.6] [--modes fsdp+ac fsdp+ac+offload]

The model is a stack of transformer encoder layers of ``--width`` (AdamW, one sequence of
``--seq`` tokens per step), built on the meta device and sharded by ``runtime.shard`` with
activation checkpointing, as docs/runtime.md tells a user to build a model larger than a
worker: bf16 compute, fp32 weights, gradients and Adam state. Without offload all of those
live on the GPU (16 bytes a parameter); with offload (``runtime.shard(offload=True)``) they
live in host memory and the GPU holds only the layer at work, so the host's memory bounds
the model instead.

For each mode and GPU memory cap the search starts at the layers an estimate says fit and
steps up while a model trains (``--steps`` timed steps after a warm one, finite loss) and
down while one fails, each try in a fresh process. A cap of 79.6 GiB is an H100 80GB's
memory on a larger GPU (``torch.cuda.set_per_process_memory_fraction``: the caching
allocator's limit; the CUDA context is outside it on both). A failed try says why: the GPU
or the host out of memory (the kernel's OOM killer). The search stops trying upward when its
time (``--budget-s`` per mode and cap) is spent, and then says so.
On a machine without a GPU the same code runs on CPU (gloo; offload means nothing there),
which is how it is tested, at small widths.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _layer(width: int):
    import torch

    return torch.nn.TransformerEncoderLayer(width, max(1, width // 128), 4 * width, dropout=0.0, batch_first=True,
                                            norm_first=True)


def params_per_layer(width: int) -> int:
    import torch

    with torch.device("meta"):
        return sum(p.numel() for p in _layer(width).parameters())


def trial(spec: dict) -> dict:
    """One model of ``spec['layers']`` layers: build, shard, train; what it took."""
    import resource

    import torch

    from deeppod import runtime

    cuda = torch.cuda.is_available()
    runtime.init()
    if cuda and spec.get("cap_gib"):
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, spec["cap_gib"] * 2**30 / total))
    width, layers = spec["width"], spec["layers"]
    torch.manual_seed(0)
    began = time.perf_counter()
    try:
        with torch.device("meta"):
            model = torch.nn.TransformerEncoder(_layer(width), layers, enable_nested_tensor=False)
        model = runtime.shard(model, activation_checkpointing=spec["ac"], offload=spec["offload"])
        params = sum(p.numel() for p in model.parameters())
        # fused: one kernel over every tensor, where foreach's temporaries cost 4+ bytes a parameter
        opt, kind = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True), "fused"
        built_s = time.perf_counter() - began
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        x = torch.randn(spec["batch"], spec["seq"], width, device=device)
        losses, times = [], []
        for step in range(1 + spec["steps"]):
            t = time.perf_counter()
            loss = model(x).float().pow(2).mean()
            loss.backward()
            try:
                opt.step()
            except (RuntimeError, NotImplementedError) as e:
                if step or "out of memory" in str(e):
                    raise
                print(f"fused AdamW failed ({str(e)[:200]}): foreach instead", file=sys.stderr)
                opt, kind = torch.optim.AdamW(model.parameters(), lr=1e-5), "foreach"
                opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss))  # waits for the step
            if step:
                times.append(time.perf_counter() - t)
    except torch.OutOfMemoryError as e:
        return {"ok": False, "why": "GPU out of memory: " + str(e).splitlines()[0][:200]}
    if not all(map(lambda v: v == v and abs(v) != float("inf"), losses)):
        return {"ok": False, "why": f"loss not finite: {losses}"}
    step_s = sorted(times)[len(times) // 2]
    tokens = spec["batch"] * spec["seq"]
    # 6 FLOPs a parameter a token, 8 with each layer's forward again (activation checkpointing)
    flops = (8 if spec["ac"] else 6) * params * tokens
    return {"ok": True, "params": params, "built_s": round(built_s, 1), "step_s": round(step_s, 3),
            "tokens_per_s": round(tokens / step_s), "tflops": round(flops / step_s / 1e12, 1),
            "gpu_peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else 0.0,
            "gpu_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2) if cuda else 0.0,
            "host_peak_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
            "optimizer": kind, "losses": [round(v, 4) for v in losses]}


def run_trial(spec: dict, timeout_s: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTORCH_CUDA_ALLOC_CONF"] = env.get("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    began = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, __file__, "--trial", json.dumps(spec)], env=env, capture_output=True,
                           text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"ok": False, "why": f"took over {timeout_s:.0f} s", "wall_s": round(time.perf_counter() - began)}
    wall = round(time.perf_counter() - began, 1)
    if p.returncode == -9:
        return {"ok": False, "why": "killed (SIGKILL: the host's OOM killer)", "wall_s": wall}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        lines_err = p.stderr.strip().splitlines() or ["(no output)"]
        tail = next((ln for ln in reversed(lines_err) if "Error" in ln), lines_err[-1]).strip()[:300]
        out_of_memory = any(w in p.stderr.lower() for w in ("out of memory", "cannot allocate", "can't allocate",
                                                             "bad_alloc"))
        return {"ok": False, "why": ("out of memory: " if out_of_memory else "error: ") + tail,
                "error": not out_of_memory, "wall_s": wall}
    return json.loads(lines[-1]) | {"wall_s": wall}


def memory_gib(cap: str) -> float | None:
    """The GPU memory a cap stands for in GiB (``full``: the device's; None without a GPU)."""
    import torch

    if cap != "full":
        return float(cap)
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory / 2**30
    return None


def host_available_gib() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return 0.0


def search(mode: str, cap: str, a, per_layer: int, log) -> dict:
    offload = "offload" in mode
    if offload:  # the host holds the 16 bytes a parameter; it runs the rest of the machine too
        start = int(host_available_gib() * 2**30 * a.offload_fill / (16 * per_layer))
    else:  # 16 bytes a parameter on the GPU, and the layer at work: its gathered bf16 weights,
        # the next one's, their gradients (8 bytes a parameter of one layer), 2 GiB of the rest
        bound = memory_gib(cap) or host_available_gib()
        start = int((bound * 2**30 - 2 * 2**30 - 8 * per_layer) / (16 * per_layer))
    start = max(1, a.start_layers or start)
    spec = {"width": a.width, "seq": a.seq, "batch": a.batch, "steps": a.steps, "ac": "ac" in mode,
            "offload": offload, "cap_gib": None if cap == "full" else float(cap)}
    tried: dict[int, dict] = {}
    began = None  # the time of the first model that trains: the budget is for the tries after it
    n = min(start, a.max_layers)
    while n not in tried:
        r = run_trial(spec | {"layers": n}, a.trial_timeout_s)
        tried[n] = r
        log(f"{mode:16s} cap {cap:>5s}: {n:3d} layers ({n * per_layer / 1e9:5.2f} B parameters): "
            + (f"trains, {r['step_s']} s a step ({r['tflops']} TFLOP/s), GPU peak {r['gpu_peak_gib']} GiB, "
               f"host peak {r['host_peak_gib']} GiB, built in {r['built_s']} s, losses {r['losses']}"
               if r["ok"] else f"fails: {r['why']}") + f" [{r['wall_s']} s]")
        if not r["ok"] and r.get("error"):
            break  # not a size limit: nothing to learn from sizes
        lo = max((k for k, v in tried.items() if v["ok"]), default=0)
        hi = min((k for k, v in tried.items() if not v["ok"]), default=a.max_layers + 1)
        if lo and began is None:
            began = time.perf_counter()
        if lo and time.perf_counter() - began > a.budget_s:
            break
        if not lo:
            n = max(1, hi - max(1, hi // 20))  # the estimate was high: down in twentieths
        elif hi > a.max_layers:
            n = lo + 1
        elif hi - lo > 1:
            n = (lo + hi) // 2
        else:
            break
        if n == hi or n > a.max_layers:
            break
    ok = [k for k, r in tried.items() if r["ok"]]
    best = max(ok) if ok else None
    failed_above = best is not None and (best + 1) in tried and not tried[best + 1]["ok"]
    return {"mode": mode, "cap": cap, "best_layers": best,
            "best_params": best * per_layer if best else None, "bracketed": failed_above,  # the next size up failed
            "tries": {str(k): v for k, v in sorted(tried.items())}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trial", help=argparse.SUPPRESS)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2, help="timed steps after one warm step")
    ap.add_argument("--modes", nargs="+", default=["fsdp+ac", "fsdp+ac+offload"])
    ap.add_argument("--caps", nargs="+", default=["full", "79.6"],
                    help="GPU memory caps in GiB ('full': the device's); offload is searched once, uncapped")
    ap.add_argument("--offload-fill", type=float, default=0.85,
                    help="offload's first try: this share of the host's available memory at 16 bytes a parameter")
    ap.add_argument("--start-layers", type=int, default=0, help="first try (default: the estimate)")
    ap.add_argument("--max-layers", type=int, default=400)
    ap.add_argument("--budget-s", type=float, default=120, help="per mode and cap: no try upward after this")
    ap.add_argument("--trial-timeout-s", type=float, default=300)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "largest_model.json")
    a = ap.parse_args()
    if a.trial:
        print(json.dumps(trial(json.loads(a.trial))), flush=True)
        os._exit(0)  # the process group's teardown is not what is measured
    import torch

    sys.path.insert(0, str(ROOT / "src"))
    from deeppod.bench.spread import machine

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    print(machine(), "|", device, f"| torch {torch.__version__} | host available {host_available_gib():.0f} GiB",
          flush=True)
    per_layer = params_per_layer(a.width)
    results = []
    for mode in a.modes:
        for cap in (["full"] if "offload" in mode else a.caps):
            results.append(search(mode, cap, a, per_layer, lambda s: print(s, flush=True)))
    print("\n| mode | GPU memory (GiB) | largest that trains | step | smallest that failed |")
    print("| --- | --- | --- | --- | --- |")
    for r in results:
        tries = {int(k): v for k, v in r["tries"].items()}
        best = tries.get(r["best_layers"] or -1)
        failed = min((k for k, v in tries.items() if not v["ok"] and k > (r["best_layers"] or 0)), default=None)
        print(f"| {r['mode']} | {r['cap']} | "
              + (f"{r['best_layers']} layers, {r['best_params'] / 1e9:.2f} B parameters, GPU peak "
                 f"{best['gpu_peak_gib']} GiB, host peak {best['host_peak_gib']} GiB | {best['step_s']} s, "
                 f"{best['tflops']} TFLOP/s" if best else "none | ")
              + (f" | {failed} layers: {tries[failed]['why'][:160]} |" if failed else " | none tried |"))
    a.out.write_text(json.dumps({"machine": machine(), "device": device, "torch": torch.__version__,
                                 "args": {k: v for k, v in vars(a).items() if k != "out"},
                                 "params_per_layer": per_layer, "results": results}, indent=1))
    print(f"results: {a.out}")


if __name__ == "__main__":
    main()
