"""The cluster page: nodes and their GPUs (free, whose, cordoned, down), each tenant's
guaranteed / in use / borrowed / lent / waiting GPUs, burst nodes and what they cost, the
queue, GPUs held over time."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from deeppod.api.deps import SessionDep, get_ctx
from deeppod.cluster.allocation import gpu_slots, gpus_over_time
from deeppod.contract import JobState
from deeppod.jobs import service as jobs
from deeppod.plans.burst_status import burst_status
from deeppod.plans.service import plan_status
from deeppod.ui.auth import ViewerDep
from deeppod.ui.render import ConsoleRoute, page

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)


@router.get("/cluster")
def cluster(request: Request, session: SessionDep, viewer: ViewerDep) -> Response:
    p = viewer.principal
    queue = jobs.list_jobs(session, p, jobs.JobFilter(state=JobState.QUEUED), limit=100, sort="id")
    return page(request, "cluster.html", nodes=gpu_slots(session, p), tenants=plan_status(session, p),
                queue=queue, queued=jobs.count_jobs(session, p, jobs.JobFilter(state=JobState.QUEUED)),
                burst=burst_status(session, p, get_ctx(request).jobs.bursting.known_asks))


@router.get("/cluster/gpus.json")
def gpus_json(session: SessionDep, viewer: ViewerDep, hours: float = 24.0) -> Response:
    hours = min(max(hours, 0.1), 24 * 30)
    return JSONResponse(gpus_over_time(session, viewer.principal, hours))
