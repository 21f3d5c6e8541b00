"""Console page for notebooks: the caller's (an administrator's: every one), each opened with a
click once it runs, and a start form with the options of ``deeppod notebook start``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from deeppod.api.deps import SessionDep, get_ctx, submit_options
from deeppod.errors import DeepPodError, Rerender
from deeppod.notebooks import service
from deeppod.ui import forms
from deeppod.ui.auth import ViewerDep
from deeppod.ui.render import ConsoleRoute, page

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)


def _rows(session, viewer):
    p = viewer.principal
    return [(j, t, u, j.user_id == p.user_id or p.is_admin) for j, t, u in service.list_notebooks(session, p)]


@router.get("/notebooks")
def notebook_list(request: Request, session: SessionDep, viewer: ViewerDep) -> Response:
    return page(request, "notebooks.html", rows=_rows(session, viewer), errors={}, values={})


@router.post("/notebooks")
def notebook_start(request: Request, session: SessionDep, viewer: ViewerDep, form: forms.FormDep) -> Response:
    viewer.may("POST", "/v1/notebooks")
    errors: dict = {}
    ask = service.NotebookStart(name=(form.get("name") or "").strip() or None,
                                gpus_per_worker=forms.number(errors, "gpus", form.get("gpus")),
                                idle_seconds=forms.time_limit(errors, "idle", form.get("idle")))
    if not errors:
        try:
            service.start(session, viewer.principal, ask, idle_default=get_ctx(request).settings.notebook_idle_seconds,
                          **submit_options(request))
            return RedirectResponse("/notebooks", status_code=303)
        except DeepPodError as exc:  # a quota, the plan's idle limit: by its field, else above the form
            errors = forms.service_error(exc, {"idle": "idle", "gpu": "gpus"}).errors
    raise Rerender(page(request, "notebooks.html", status=422, rows=_rows(session, viewer), errors=errors,
                        values=form))
