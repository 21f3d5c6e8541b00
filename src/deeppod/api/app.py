"""The FastAPI application."""

from __future__ import annotations

import os
from collections.abc import Sequence

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from deeppod import __version__
from deeppod.api import docs, errors
from deeppod.api.admission import Admission
from deeppod.api.latency import Latency
from deeppod.api.limits import BodyLimit
from deeppod.api.predict_path import PredictPath
from deeppod.api.routers import (
    access_keys,
    audit,
    burst,
    code,
    datasets,
    deployments,
    envs,
    experiments,
    images,
    jobs,
    metrics,
    models,
    monitor,
    nodes,
    notebooks,
    plans,
    servers,
    sizing,
    tenants,
    tokens,
    users,
)
from deeppod.audit.log import AuditMiddleware
from deeppod.monitor.prometheus import ApiLatency
from deeppod.store.db import pool_capacity

BACKGROUND_CONNECTIONS = 8  # the control loops' own (reconcile, deployments, audit, monitor, ...)


SLOTS_PER_CPU = 3  # requests inside a core's share of the one GIL (docs/benchmarks.md, issue 46)


def admission_slots(ctx, cpus: int | None = None) -> int:
    """Requests inside the app at once: DEEPPOD_API_CONCURRENCY, else what the database pool
    serves beside the control loops, and no more than ``SLOTS_PER_CPU`` per CPU the server may
    use (``cpus``; default: its affinity): past a few threads a core, more requests inside
    only take turns at the GIL while the event loop waits behind them (docs/benchmarks.md)."""
    if ctx.settings.api_concurrency:
        return ctx.settings.api_concurrency
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(4, min(pool_capacity(ctx.engine) - BACKGROUND_CONNECTIONS, SLOTS_PER_CPU * cpus))


def create_app(ctx, *, parts: Sequence = ()) -> FastAPI:
    """The API. ``parts``: more of the app, each with ``install(app)`` and ``is_upload(method,
    path)`` (the web console: server.http_app composes them)."""
    app = FastAPI(title="DeepPod", version=__version__, docs_url=None, redoc_url=None,
                  description="DeepPod control plane: jobs, datasets, models, deployments, tenants, users, "
                              "tokens, nodes, servers, experiments.")
    app.state.ctx = ctx
    app.state.latency = CollectorRegistry()
    latency = ApiLatency(app.state.latency)
    docs.install(app)
    errors.install(app)
    for r in (jobs, code, metrics, tenants, users, tokens, nodes, servers, plans, datasets, models, deployments, audit,
              experiments, monitor, envs, images, access_keys, sizing, burst, notebooks):
        app.include_router(r.router)
    app.include_router(deployments.replicas_router)
    app.include_router(experiments.host_router)
    app.include_router(deployments.page_router)
    for part in parts:
        part.install(app)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict:  # in the event loop: never queued behind the thread pool's DB work
        """Answers on every server; ``leader``: whether this one runs the jobs (a standby of a
        failover control plane serves the API only); ``live_servers``: how many servers the
        leader saw alive at its last heartbeat (every one is in the API URLs it gives jobs)."""
        return {"ok": True, "version": __version__, "scheduler_round_ms": round(ctx.jobs.last_round_ms, 3),
                "leader": ctx.leader.leading, "epoch": ctx.leader.epoch,
                "live_servers": len(ctx.leader.live_urls) if ctx.leader.leading else None,
                "rounds": ctx.jobs.rounds}

    app.add_middleware(BodyLimit, max_bytes=ctx.settings.max_body_bytes, streamed=lambda method,
                       path: datasets.is_upload(method, path) or code.is_upload(method,
                                                                                path) or deployments.is_predict(method,
                                                                                                                path)
                       or any(p.is_upload(method, path) for p in parts))
    errors.document(app)
    slots = admission_slots(ctx)
    latency.slots.set(slots)
    app.add_middleware(Admission, slots=slots, wait_s=ctx.settings.api_queue_seconds, on_shed=latency.shed.inc)
    app.add_middleware(PredictPath)  # the data path skips the routing every other call pays
    app.add_middleware(AuditMiddleware, audit=ctx.audit)  # outermost: sees every answer, 413s included
    app.add_middleware(Latency, record=latency.observe)
    return app
