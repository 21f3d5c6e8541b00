"""Inference serving: a DeepPod deployment (dynamic batching, through the control plane's
predict route) vs a plain FastAPI + torch server running one request per forward pass,
same model, same image, same machine, one after the other in one run.
Aim: >= 2x the baseline's throughput at equal or better p99 at concurrency >= 8 (CPU).

    python benchmarks/infer_throughput.py [--model mobilenet_v3_small] [--image-size 224]
        [--replicas 1] [--cpus-per-replica 2] [--max-batch 32] [--max-wait-ms 5]
        [--concurrency 1,8,32,64] [--duration 30] [--gpus-per-replica 0] [--out FILE]

It starts its own DeepPod server in a temporary home, registers the model (random weights:
serving speed does not depend on them), deploys it, and runs `deeppod bench infer`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def write_model(out: Path, name: str, size: int, classes: int = 1000) -> None:
    import torch
    import torchvision

    out.mkdir(parents=True)
    model = torchvision.models.get_model(name, weights=None, num_classes=classes).eval()
    torch.save(model.state_dict(), out / "weights.pt")
    program = torch.export.export(model, (torch.zeros(2, 3, size, size),),
                                  dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},))
    torch.export.save(program, str(out / "model.pt2"))
    (out / "signature.json").write_text(json.dumps({
        "task": "image-classification", "model": name, "classes": [f"class-{i}" for i in range(classes)],
        "input": {"kind": "image", "shape": [3, size, size], "dtype": "float32", "resize": [size, size],
                  "color": "RGB", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "crop": "center"},
        "metrics": {}}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mobilenet_v3_small")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--cpus-per-replica", type=float, default=float(os.cpu_count() or 1))
    ap.add_argument("--gpus-per-replica", type=int, default=0)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="deeppod-bench-infer-"))
    port = 7600 + os.getpid() % 300
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPPOD_")}
    env.update({"DEEPPOD_HOME": str(home), "DEEPPOD_CONFIG": str(home / "client.json")})
    cli = [sys.executable, "-m", "deeppod.cli"]
    server = subprocess.Popen([*cli, "server", "--port", str(port)], env=env, stdout=open(home / "server.log", "wb"),
                              stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        env.update({"DEEPPOD_API_URL": url, "DEEPPOD_TOKEN": (home / "admin.token").read_text().strip()})
        write_model(home / "artifact", args.model, args.image_size)

        def run(*a):
            subprocess.run([*cli, *a], env=env, check=True)

        run("models", "register", "bench", "--path", str(home / "artifact"))
        run("deploy", "bench@1", "--replicas", str(args.replicas), "--cpus-per-replica", f"{args.cpus_per_replica:g}",
            "--gpus-per-replica", str(args.gpus_per_replica), "--max-batch", str(args.max_batch),
            "--max-wait-ms", f"{args.max_wait_ms:g}")
        out = args.out or ROOT / "benchmarks" / "results" / f"infer_{args.model}_{'gpu' if args.gpus_per_replica else 'cpu'}.json"
        run("bench", "infer", "--deployment", "bench", "--concurrency", args.concurrency,
            "--duration", f"{args.duration:g}", "--out", str(out))
        doc = json.loads(out.read_text())
        doc.update(model_name=args.model, image_size=args.image_size, cpus_per_replica=args.cpus_per_replica,
                   machine=f"{os.cpu_count()} CPUs" + (", GPU" if args.gpus_per_replica else ""))
        out.write_text(json.dumps(doc, indent=1))
        print(f"results: {out}")
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
