"""A stand-in for a peer's own Python where the peer is not installed (NVIDIA DALI, Ray Serve,
Ray Tune): the benchmarks that compare DeepPod with a peer start the peer's script with the
Python they are given (``--dali-python``, ``--ray-python``). Given this one instead, each
script is answered by the same protocol, with the work done by what is installed here, so
the benchmark's own handling of the peer (starting it, reading its answer, its column in the
table) runs in the smoke test. Its figures are not a peer's and are never recorded.

    fake_peer.py SCRIPT ARGS...     (as ``PYTHON SCRIPT ARGS...``)
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path


def dali(root: str, threads: str, batch: str, epochs: str) -> None:
    """benchmarks/dali_pipeline.py's answer: decode and crop every image with Pillow, timed."""
    from PIL import Image

    files = sorted(p for p in Path(root).rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    began = time.perf_counter()
    for _ in range(int(epochs)):
        for f in files:
            with Image.open(f) as im:
                im.convert("RGB").resize((224, 224))
    took = time.perf_counter() - began
    print(json.dumps({"img_s": len(files) * int(epochs) / max(took, 1e-9), "images": len(files)}), flush=True)


def ray_serve(model_dir: str, port: str, *_: str) -> None:
    """benchmarks/ray_serve_app.py's: the model behind POST /predict on the port, 'ready' once it answers."""
    import uvicorn

    from deeppod.bench.plain_server import build

    server = uvicorn.Server(uvicorn.Config(build(model_dir), host="127.0.0.1", port=int(port), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while True:
        try:
            socket.create_connection(("127.0.0.1", int(port)), timeout=1).close()
            break
        except OSError:
            if not thread.is_alive():
                sys.exit("the stand-in server did not start")
            time.sleep(0.1)
    print("ready", flush=True)
    thread.join()


def main() -> None:
    script, args = sys.argv[1], sys.argv[2:]
    name = Path(script).name
    if name == "dali_pipeline.py":
        dali(*args)
    elif name == "ray_serve_app.py":
        ray_serve(*args)
    elif name == "tune.py" and args[:1] == ["_ray"]:  # Ray Tune's search: the sequential Optuna one in its place
        os.execv(sys.executable, [sys.executable, script, "_optuna", *args[1:]])
    else:
        sys.exit(f"fake_peer.py: no stand-in for {name} {' '.join(args)}")


if __name__ == "__main__":
    main()
