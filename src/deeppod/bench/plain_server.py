"""The inference baseline: a plain FastAPI + torch server as people write it, one request
per forward pass, run in FastAPI's thread pool. ``python -m deeppod.bench.plain_server
MODEL_DIR PORT``. It decodes and preprocesses exactly as DeepPod does, so only the
serving differs."""

from __future__ import annotations

import sys

import torch
import uvicorn
from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool

from deeppod.runtime import inference


def build(model_dir: str) -> FastAPI:
    model = inference.load(model_dir)
    inference.forward(model, [torch.zeros((3, model.size, model.size), dtype=torch.uint8)])  # warm
    app = FastAPI()

    def work(data: bytes) -> dict:
        x = inference.decode(data, model.signature)
        return {"predictions": inference.top_k(inference.forward(model, [x]), model.classes, 5)}

    @app.post("/predict")
    async def predict(request: Request) -> dict:
        return await run_in_threadpool(work, await request.body())

    return app


if __name__ == "__main__":
    uvicorn.run(build(sys.argv[1]), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning", access_log=False)
