from fastapi import APIRouter, Query, Request

from deeppod.api.deps import Id, PrincipalDep, SessionDep, get_ctx
from deeppod.api.schemas.metrics import HistogramOut, MetricsAccepted, MetricsIn, MetricsOut
from deeppod.experiments import service as experiments
from deeppod.jobs import metrics

router = APIRouter(prefix="/v1/jobs/{job_id}", tags=["metrics"])


@router.post("/metrics", status_code=202, response_model=MetricsAccepted, response_model_exclude_defaults=True)
def ingest(job_id: Id, body: MetricsIn, request: Request, session: SessionDep,
           principal: PrincipalDep) -> MetricsAccepted:
    points = [p.model_dump() for p in body.points]
    stored = metrics.ingest(session, principal, job_id, points)
    if experiments.awaits_judgement(session, job_id, points):  # a trial at a rung: its pruner decides now
        session.commit()
        get_ctx(request).experiments.judged()
    # a search's trial hears here that a pruner stopped it (in a process that runs trial after trial, or its own job)
    return MetricsAccepted(stored=stored, **experiments.stopping(session, job_id))


@router.get("/metrics", response_model=MetricsOut)
def read(job_id: Id, session: SessionDep, principal: PrincipalDep,
         names: str | None = Query(None, description="comma-separated metric names (default: all)"),
         max_points: int = Query(500, ge=2, le=100_000)) -> MetricsOut:
    wanted = [n for n in (names or "").split(",") if n] or None
    return MetricsOut(**metrics.series(session, principal, job_id, wanted, max_points))


@router.get("/histograms", response_model=list[HistogramOut])
def read_histograms(job_id: Id, session: SessionDep, principal: PrincipalDep, name: str | None = None,
                    max_steps: int = Query(50, ge=1, le=10_000)) -> list[HistogramOut]:
    return [HistogramOut(**h) for h in metrics.histograms(session, principal, job_id, name, max_steps)]
