"""Console pages for hyperparameter searches (``deeppod tune``): the list, and one search with
its trials (parameters, values, states, each linked to its job), the best value so far over
time, parallel coordinates of parameters against the value, and the trials' curves overlaid."""

from __future__ import annotations

import math

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from deeppod.api.deps import SessionDep
from deeppod.experiments import service
from deeppod.jobs import metrics
from deeppod.states import TrialState
from deeppod.ui.auth import ViewerDep
from deeppod.ui.render import ConsoleRoute, page

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)
MAX_CURVES = 200  # the overlaid curves: the best trials first beyond this many


@router.get("/experiments")
def experiment_list(request: Request, session: SessionDep, viewer: ViewerDep) -> Response:
    rows = [(e, t, u, c, service.best(session, e)) for e, t, u, c in
            service.list_experiments(session, viewer.principal)]
    return page(request, "experiments.html", rows=rows)


@router.get("/experiments/{name}")
def experiment_page(request: Request, name: str, session: SessionDep, viewer: ViewerDep,
                    tenant: str | None = None) -> Response:
    exp = service.get_experiment(session, viewer.principal, name, tenant)
    tenant_name, user = service.owner_names(session, exp)
    rows = service.trials(session, exp)
    return page(request, "experiment.html", exp=exp, tenant=tenant_name, user=user, rows=rows,
                params=list(exp.space), best=service.best(session, exp),
                counts={s: sum(1 for t, _ in rows if t.state == s) for s in {t.state for t, _ in rows}})


@router.get("/experiments/{name}/data.json")
def experiment_data(name: str, session: SessionDep, viewer: ViewerDep, tenant: str | None = None) -> Response:
    """What the page's charts draw: each trial's parameters, value and state, the best value
    after each completed trial (in the order they ended), and the trials' curves of the metric."""
    exp = service.get_experiment(session, viewer.principal, name, tenant)
    rows = service.trials(session, exp)
    trials = [{"number": t.number, "job_id": t.job_id, "state": t.state, "params": t.params,
               "value": _finite(t.value if t.value is not None else t.best)} for t, _ in rows]
    done = sorted((t for t, _ in rows if t.state == TrialState.COMPLETED and _finite(t.value) is not None
                   and t.ended_at is not None), key=lambda t: (t.ended_at, t.number))
    best_so_far, best = [], None
    for t in done:
        if best is None or (t.value > best if exp.mode == "max" else t.value < best):
            best = t.value
        best_so_far.append([t.ended_at.timestamp(), best, t.number])
    sign = -1 if exp.mode == "max" else 1
    ranked = sorted(rows, key=lambda r: (r[0].value is None and r[0].best is None,
                                         sign * (r[0].value if r[0].value is not None else r[0].best or 0)))
    curves = metrics.trial_series(session, [(t.number, t.job_id) for t, _ in ranked[:MAX_CURVES]], exp.metric)
    return JSONResponse({"name": exp.name, "state": exp.state, "metric": exp.metric, "mode": exp.mode,
                         "created_at": exp.created_at.timestamp(),
                         "ended_at": exp.ended_at.timestamp() if exp.ended_at else None,
                         "space": exp.space,
                         "trials": trials, "best_so_far": best_so_far,
                         "curves": {str(k): v for k, v in sorted(curves.items())}})


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None
