"""``deeppod bench train``: images/s per worker and in total, and scaling efficiency from
1 to N workers, with the job contract (torchrun environment) and the DeepPod runtime."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from deeppod.contract import free_port


def run_workers(workers: int, args: list[str], module: str = "deeppod.bench.train_worker",
                threads_per_worker: int = 1, timeout: float = 3600) -> list[dict]:
    """Start ``workers`` local processes with the torchrun environment; collect their results."""
    port = free_port()
    procs = []
    for rank in range(workers):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(workers),
               "LOCAL_WORLD_SIZE": str(workers), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "OMP_NUM_THREADS": str(threads_per_worker)}
        if "CUDA_VISIBLE_DEVICES" not in os.environ:
            env.pop("CUDA_VISIBLE_DEVICES", None)
        procs.append(subprocess.Popen([sys.executable, "-m", module, *args], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"a benchmark worker failed (exit {p.returncode}):\n{out[-3000:]}")
        for line in out.splitlines():
            if line.startswith("DEEPPOD-BENCH "):
                results.append(json.loads(line.split(" ", 1)[1]))
    return results


def summarize(results: list[dict]) -> dict:
    total = sum(r["images_per_second"] for r in results)
    return {"workers": len(results), "images_per_second_total": total,
            "images_per_second_per_worker": total / len(results),
            **{k: v for r in results for k, v in r.items() if k.startswith("checkpoint_")}}


def bench_train(model: str, batch_size: int, workers: int, image_size: int, steps: int, forward_only: bool,
                checkpoint: bool = True) -> dict:
    args = ["--model", model, "--batch-size", str(batch_size), "--image-size", str(image_size),
            "--steps", str(steps)] + (["--forward-only"] if forward_only else [])
    one = summarize(run_workers(1, args))
    many = summarize(run_workers(workers, args + (["--checkpoint"] if checkpoint else []))) if workers > 1 else one
    return {"model": model, "batch_size_per_worker": batch_size, "image_size": image_size, "steps": steps,
            "forward_only": forward_only, "one_worker": one, "n_workers": many,
            "scaling_efficiency": many["images_per_second_total"] / (workers * one["images_per_second_total"])}
