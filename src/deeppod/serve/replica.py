"""One serving replica: ``python -m deeppod.serve.replica --model-dir DIR``.

Runs as a DeepPod job (kind "serve"): loads the model's serving form, warms it up, listens
on loopback, tells the control plane where it listens, and answers predict requests with
dynamic batching. Bad input gets a 4xx and never stops the replica. Imports no server code.

It answers only the control plane: every route but a bare ``/healthz`` needs the secret the
platform gave this replica (``DEEPPOD_REPLICA_SECRET``, sent by the balancer in
``X-DeepPod-Replica-Secret``), so another tenant's job that finds its port gets a 401 and
goes through the platform's predict route, with a token, like everyone else. A client the
control plane gave a direct token (serve/direct.py) may call ``/predict`` and ``/signature``
itself.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import logging
import os
import signal
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from deeppod import settings
from deeppod.contract import (
    ENV_API_URL,
    ENV_CA_CERT,
    ENV_DEPLOYMENT_ID,
    ENV_DIRECT_KEY,
    ENV_JOB_ID,
    ENV_NODE_ADDRESS,
    ENV_REPLICA_SECRET,
    ENV_TOKEN,
    REPLICA_SECRET_HEADER,
)
from deeppod.errors import BadInput, DeepPodError
from deeppod.runtime import inference
from deeppod.serve import inputs
from deeppod.serve.batcher import Batcher
from deeppod.serve.direct import ControlPlane, DirectAccess
from deeppod.serve.metrics import ReplicaMetrics

log = logging.getLogger("deeppod.serve.replica")


def error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


class Replica:
    def __init__(self, model: inference.Loaded, *, max_batch: int, max_wait_ms: float, max_body_bytes: int,
                 version: int | None = None, name: str = "", replica_id: str = "", decode_threads: int = 2,
                 batch_thread: bool = True, secret: str = "", direct: DirectAccess | None = None):
        self.direct = direct  # None: only the control plane's secret opens /predict
        self.model, self.version, self.name, self.replica_id = model, version, name, replica_id
        self.secret = secret.encode()  # empty: started by hand, outside the platform: anyone may call
        self.max_body_bytes = max_body_bytes
        self.metrics = ReplicaMetrics(deployment=name or "-", replica=replica_id or "-")
        self.batcher = Batcher(self._forward, max_batch=max_batch, max_wait=max_wait_ms / 1000.0,
                               on_batch=self._observe_batch, thread=batch_thread, coming=lambda: self.coming)
        self.decoder = ThreadPoolExecutor(decode_threads, thread_name_prefix="decode")
        self.inflight = 0
        self.coming = 0  # accepted requests whose items are not in the batcher yet (read or decoded)
        self.started = time.time()

    def _forward(self, items: list) -> list:
        return list(inference.forward(self.model, items))

    def _observe_batch(self, size: int, seconds: float) -> None:
        self.metrics.batch_size.observe(size)
        self.metrics.batch_seconds.observe(seconds)

    def _prepare(self, got: inputs.Items) -> list:
        sig = self.model.signature
        out = []
        for n, data in enumerate(got.images):
            try:
                out.append(inference.decode(data, sig))
            except BadInput as exc:
                raise BadInput(f"image {n}: {exc}" if len(got.images) + len(got.tensors) > 1 else str(exc)) from None
        for n, t in enumerate(got.tensors):
            try:
                out.append(inference.tensor_input(t, sig))
            except BadInput as exc:
                raise BadInput(f"tensors[{n}]: {exc}") from None
        return out

    async def _body(self, request: Request) -> bytes:
        body = await inputs.read_body(request, self.max_body_bytes, "")
        request._body = body  # starlette's multipart parser reads the cached body from here
        return body

    async def predict(self, request: Request) -> JSONResponse:
        began = time.perf_counter()
        self.inflight += 1
        self.coming += 1
        status = 200
        try:
            try:
                body = await self._body(request)
                got = await inputs.read(request, request.headers.get("content-type", ""), body)
                items = await asyncio.get_running_loop().run_in_executor(self.decoder, self._prepare, got)
                futures = self.batcher.submit(items)
            finally:
                self.coming -= 1
            rows = [await asyncio.wrap_future(f) for f in futures]
            import torch

            answers = inference.top_k(torch.stack(rows), self.model.classes, got.top_k)
            self.metrics.items.inc(len(items))
            return JSONResponse({"model": self.name, "version": self.version, "replica": self.replica_id,
                                 "predictions": answers})
        except DeepPodError as exc:  # bad input: 422, 413 or 415 with what was expected
            status = exc.status
            return error(exc.status, exc.code, exc.message)
        except Exception:  # the replica outlives any one request
            log.exception("predict failed")
            status = 500
            return error(500, "internal", "the replica failed to answer; see its log")
        finally:
            self.inflight -= 1
            self.metrics.requests.inc(code=str(status))
            self.metrics.latency.observe(time.perf_counter() - began)

    def _caller_ok(self, request: Request) -> bool:
        return not self.secret or hmac.compare_digest(request.headers.get(REPLICA_SECRET_HEADER, "").encode(),
                                                      self.secret)

    async def healthz(self, request: Request) -> JSONResponse:
        if not self._caller_ok(request):  # alive, and nothing more to whoever asks
            return JSONResponse({"ok": True})
        return JSONResponse({"ok": True, "model": self.name, "version": self.version, "replica": self.replica_id,
                             "inflight": self.inflight, "queue": self.batcher.depth,
                             "uptime_s": round(time.time() - self.started, 1)})

    async def prometheus(self, request: Request) -> PlainTextResponse:
        return PlainTextResponse(self.metrics.render(self.batcher.depth, self.inflight),
                                 media_type="text/plain; version=0.0.4")

    async def signature(self, request: Request) -> JSONResponse:
        return JSONResponse(self.model.signature)

    def app(self) -> Starlette:
        routes = [Route("/predict", self._platform_or_direct(self.predict), methods=["POST"]),
                  Route("/healthz", self.healthz), Route("/metrics", self._only_the_platform(self.prometheus)),
                  Route("/signature", self._platform_or_direct(self.signature))]
        return Starlette(routes=routes)

    def _only_the_platform(self, endpoint):
        async def guarded(request: Request):
            if not self._caller_ok(request):
                return error(401, "unauthenticated", "this replica answers only DeepPod's control plane: call "
                                                     "POST /v1/deployments/NAME/predict on the server with a token")
            return await endpoint(request)

        return guarded

    def _platform_or_direct(self, endpoint):
        platform_only = self._only_the_platform(endpoint)

        async def guarded(request: Request):
            if self.direct is None:
                return await platform_only(request)
            if self._caller_ok(request):
                return await endpoint(request)
            client = request.client.host if request.client else ""
            claims, refusal = self.direct.check(request.headers.get("authorization", ""), client)
            if refusal is not None:
                return error(refusal.status, refusal.code, refusal.message)
            began = time.perf_counter()
            response = await endpoint(request)
            self.direct.used(claims["j"], response.status_code, time.perf_counter() - began)
            return response

        return guarded


def warm_up(model: inference.Loaded, max_batch: int) -> None:
    """The first forward of each batch size is slow; pay it before taking traffic."""
    import torch

    for n in sorted({1, max_batch}):
        inference.forward(model, [torch.zeros((3, model.size, model.size), dtype=torch.uint8)] * n)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--name", default="")
    p.add_argument("--version", type=int, default=None)
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--max-body-bytes", type=int, default=settings.default("predict_max_bytes"))
    p.add_argument("--host", default=os.environ.get(ENV_NODE_ADDRESS) or "127.0.0.1",
                   help="where to listen: the node's address where a cluster placed it, else 127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: any free port (the control plane is told which)")
    p.add_argument("--decode-threads", type=int, default=2)
    return p.parse_args(argv)


def announce(url: str, version: int | None) -> None:
    """Tell the control plane where this replica listens (retries while it is restarting)."""
    from deeppod.runtime.registry import api_call

    job_id = os.environ.get(ENV_JOB_ID)
    if not job_id or not os.environ.get(ENV_API_URL):
        return
    for attempt in range(30):
        try:
            api_call("PUT", f"/v1/replicas/{job_id}", {"url": url, "version": version})
            return
        except RuntimeError as exc:
            log.warning("could not announce %s (%s); retrying", url, exc)
            time.sleep(min(5.0, 0.2 * (attempt + 1)))
    raise SystemExit("the control plane never took this replica's address")


def direct_access() -> DirectAccess | None:
    """Direct tokens, when the platform gave this replica its deployment's key; the thread that
    syncs with the control plane starts with it."""
    key, dep_id, job_id = (os.environ.pop(ENV_DIRECT_KEY, ""), os.environ.get(ENV_DEPLOYMENT_ID, ""),
                           os.environ.get(ENV_JOB_ID))
    if not key or not dep_id.isdigit() or not job_id or not os.environ.get(ENV_API_URL):
        return None
    direct = DirectAccess(bytes.fromhex(key), int(dep_id))
    plane = ControlPlane(os.environ[ENV_API_URL], os.environ.get(ENV_TOKEN, ""), job_id,
                         cafile=os.environ.get(ENV_CA_CERT))
    threading.Thread(target=direct.run, args=(plane.post, threading.Event()), name="direct-sync", daemon=True).start()
    return direct


def main(argv=None) -> int:
    import torch
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args = parse_args(argv)
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        os.environ.pop("CUDA_VISIBLE_DEVICES")  # no GPU slot given: CPU
    model = inference.load(args.model_dir)
    began = time.perf_counter()
    warm_up(model, args.max_batch)
    log.info("model %s v%s loaded on %s (%d torch threads), warm in %.1f s", args.name, args.version, model.device,
             torch.get_num_threads(), time.perf_counter() - began)
    replica = Replica(model, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                      max_body_bytes=args.max_body_bytes, version=args.version, name=args.name,
                      replica_id=os.environ.get(ENV_JOB_ID, ""), decode_threads=args.decode_threads,
                      batch_thread=False, secret=os.environ.pop(ENV_REPLICA_SECRET, ""),
                      direct=direct_access())
    # proto=IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets that say so;
    # without it every response waits ~40 ms for a delayed ACK (measured).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(1024)
    url = f"http://{args.host}:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(replica.app(), log_level="warning", access_log=False,
                                           timeout_graceful_shutdown=30))
    startup = server.startup

    async def started(sockets=None):  # announce only once uvicorn accepts connections
        await startup(sockets=sockets)
        await asyncio.get_running_loop().run_in_executor(None, announce, url, args.version)
        log.info("serving on %s", url)

    server.startup = started

    def http() -> None:
        try:
            server.run(sockets=[sock])
        finally:
            replica.batcher.close()

    def stop(signum, frame) -> None:  # uvicorn finishes the requests in flight, then the batcher stops
        server.should_exit = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # HTTP in a thread, forward passes on the main thread: torch's OpenMP pool runs about
    # twice as fast there on CPU as from a secondary thread (measured: 7 vs 17 ms).
    threading.Thread(target=http, name="http", daemon=True).start()
    replica.batcher.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
