"""Console page for notebooks: the caller's (an administrator's: every one), each opened with a
click once it runs, and a start form with the options of ``deeppod notebook start``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from deeppod.api.deps import SessionDep
from deeppod.errors import Conflict, InvalidRequest
from deeppod.notebooks import service
from deeppod.ui.auth import ViewerDep
from deeppod.ui.forms import FORM_ERROR, number, time_limit
from deeppod.ui.render import ConsoleRoute, page

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)


def _rows(session, viewer):
    p = viewer.principal
    return [(j, t, u, j.user_id == p.user_id or p.is_admin) for j, t, u in service.list_notebooks(session, p)]


@router.get("/notebooks")
def notebook_list(request: Request, session: SessionDep, viewer: ViewerDep) -> Response:
    return page(request, "notebooks.html", rows=_rows(session, viewer), errors={}, values={})


@router.post("/notebooks")
def notebook_start(request: Request, session: SessionDep, viewer: ViewerDep,
                   gpus: Annotated[str, Form()] = "", idle: Annotated[str, Form()] = "",
                   name: Annotated[str, Form()] = "") -> Response:
    viewer.may("POST", "/v1/notebooks")
    errors: dict = {}
    ask = service.NotebookStart(name=name.strip() or None, gpus_per_worker=number(errors, "gpus", gpus),
                                idle_seconds=time_limit(errors, "idle", idle))
    if not errors:
        ctx = request.app.state.ctx
        s = ctx.settings
        try:
            service.start(session, viewer.principal, ask, idle_default=s.notebook_idle_seconds,
                          default_grace=s.grace_seconds, roots=ctx.roots, code=ctx.code, jobs_dir=s.jobs_dir,
                          default_network=s.job_network, image_dir=s.image_dir, default_pids=s.pids_per_worker,
                          package_index=s.env_index)
            return RedirectResponse("/notebooks", status_code=303)
        except (InvalidRequest, Conflict) as exc:  # the service's refusal (a quota, a plan's limit), above the form
            session.rollback()
            errors[FORM_ERROR] = exc.message
    return page(request, "notebooks.html", status=422, rows=_rows(session, viewer), errors=errors,
                values={"gpus": gpus, "idle": idle, "name": name})
