"""The Ray Serve baseline for benchmarks/infer_throughput.py: the same model.pt2, decoded and
preprocessed exactly as DeepPod does, with Ray Serve's dynamic batching (@serve.batch).
Run with a Python that has ray[serve]: ``python benchmarks/ray_serve_app.py MODEL_DIR PORT
CPUS MAX_BATCH MAX_WAIT_MS``; it serves POST http://127.0.0.1:PORT/predict until killed."""

from __future__ import annotations

import sys
import time

import ray
from ray import serve
from starlette.requests import Request


def build(model_dir: str, cpus: float, max_batch: int, max_wait_ms: float):
    @serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": cpus}, max_ongoing_requests=1024)
    class Predictor:
        def __init__(self) -> None:
            import torch

            from deeppod.runtime import inference

            self.inference, self.torch = inference, torch
            self.model = inference.load(model_dir)
            inference.forward(self.model, [torch.zeros((3, self.model.size, self.model.size), dtype=torch.uint8)])

        @serve.batch(max_batch_size=max_batch, batch_wait_timeout_s=max_wait_ms / 1000.0)
        async def forward(self, items: list) -> list:
            return list(self.inference.forward(self.model, items))

        async def __call__(self, request: Request) -> dict:
            x = self.inference.decode(await request.body(), self.model.signature)
            row = await self.forward(x)
            return {"predictions": self.inference.top_k(self.torch.stack([row]), self.model.classes, 5)}

    return Predictor.bind()


if __name__ == "__main__":
    model_dir, port, cpus, max_batch, max_wait = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), \
        float(sys.argv[5])
    ray.init(num_cpus=max(2, int(cpus) + 1), include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build(model_dir, cpus, max_batch, max_wait), route_prefix="/predict")
    print("ready", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:  # the benchmark's SIGINT: shut the cluster down
        serve.shutdown()
        ray.shutdown()
