from __future__ import annotations

import time

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from deeppod.api.deps import Id, PrincipalDep, SessionDep, get_ctx
from deeppod.errors import Forbidden
from deeppod.jobs.service import get_job
from deeppod.monitor import prometheus, service

router = APIRouter(tags=["monitor"])


@router.get("/metrics", response_class=Response)
def metrics(request: Request, principal: PrincipalDep) -> Response:
    """The whole cluster in Prometheus' text format (an admin token: it names every tenant)."""
    if not principal.is_admin:
        raise Forbidden("/metrics shows every tenant's work: scrape it with an admin token")
    ctx = get_ctx(request)
    body = prometheus.render(ctx.sessions, lambda: ctx.jobs.last_round_ms, principal, request.app.state.latency)
    return Response(body, media_type=prometheus.CONTENT_TYPE)


@router.get("/v1/monitor/gpus")
def gpus(session: SessionDep, principal: PrincipalDep,
         within: float = Query(60.0, gt=0, le=86400, description="only GPUs sampled in the last this many seconds")
         ) -> list[dict]:
    """Each GPU's newest sample: utilization, memory, power, temperature, errors, its job."""
    return service.latest(session, principal, within, time.time())


@router.get("/v1/monitor/hosts")
def hosts(session: SessionDep, principal: PrincipalDep, within: float = Query(60.0, gt=0, le=86400)) -> list[dict]:
    return service.hosts(session, within, time.time())


@router.get("/v1/jobs/{job_id}/gpus")
def job_gpus(job_id: Id, session: SessionDep, principal: PrincipalDep,
             since: float | None = Query(None, description="epoch seconds"),
             max_points: int = Query(500, ge=2, le=100_000)) -> dict:
    """The job's GPUs over time ([time, utilization %, memory MiB] per GPU) and its recent mean."""
    return service.usage_of(session, get_job(session, principal, job_id), since, max_points, processes=False)


@router.get("/v1/jobs/{job_id}/usage")
def job_usage(job_id: Id, session: SessionDep, principal: PrincipalDep,
              since: float | None = Query(None, description="epoch seconds"),
              max_points: int = Query(500, ge=2, le=100_000)) -> dict:
    """What the job used over time: its GPUs (as /gpus), CPU in cores ([time, cores]) and
    resident memory ([time, MiB]) of its processes; CPU and memory where the server's machine
    runs them (the local executor; not on Ray nodes)."""
    return service.usage_of(session, get_job(session, principal, job_id), since, max_points)
