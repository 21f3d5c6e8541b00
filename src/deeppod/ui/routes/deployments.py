"""The console's deployment pages: the list, one deployment (its replicas, traffic and test
form), update, rollback and removal."""

from __future__ import annotations

import re

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from deeppod.api.deps import SessionDep, get_ctx
from deeppod.auth.roles import check_predict
from deeppod.deployments import service as deployments
from deeppod.deployments.forward import forward_predict
from deeppod.errors import InvalidRequest, NotFound
from deeppod.models import service as models
from deeppod.ui import forms
from deeppod.ui.auth import ViewerDep
from deeppod.ui.render import ConsoleRoute, fragment, page

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)
PREDICT_PATH = re.compile(r"^/deployments/[^/]+/predict$")


def is_predict(method: str, path: str) -> bool:
    """The test form's images have the predict limit, not the body limit."""
    return method == "POST" and bool(PREDICT_PATH.match(path))


@router.get("/deployments")
def deployment_list(request: Request, session: SessionDep, viewer: ViewerDep) -> Response:
    rows = [(d, deployments.describe(session, d)) for d in deployments.list_deployments(session, viewer.principal)]
    return page(request, "deployments.html", rows=rows)


def _deployment_values(request, session, viewer, name: str) -> dict:
    dep = deployments.get(session, viewer.principal, name)
    d = deployments.describe(session, dep)
    route = get_ctx(request).balancer.routes.get(dep.id)
    routed = {t.job_id for t in route.targets} if route else set()
    model = models.get_model(session, viewer.principal, d["model"])
    return dict(dep=dep, d=d, routed=routed, versions=models.versions(session, model)[::-1],
                can_change=viewer.can("PATCH", "/v1/deployments/{name}", name=name))


@router.get("/deployments/{name}")
def deployment_page(request: Request, name: str, session: SessionDep, viewer: ViewerDep) -> Response:
    return page(request, "deployment.html", **_deployment_values(request, session, viewer, name))


@router.get("/deployments/{name}/replicas")
def deployment_replicas(request: Request, name: str, session: SessionDep, viewer: ViewerDep) -> Response:
    return fragment("deployment_replicas.html", **_deployment_values(request, session, viewer, name))


@router.get("/deployments/{name}/traffic.json")
def traffic(request: Request, name: str, session: SessionDep, viewer: ViewerDep) -> Response:
    dep = deployments.get(session, viewer.principal, name)
    return JSONResponse(get_ctx(request).balancer.traffic(dep.id))


@router.post("/deployments/{name}/update")
def update(request: Request, name: str, session: SessionDep, viewer: ViewerDep, form: forms.FormDep) -> Response:
    viewer.may("PATCH", "/v1/deployments/{name}", name=name)
    errors: dict[str, str] = {}
    replicas = forms.number(errors, "replicas", form.get("replicas"))
    if errors:
        raise InvalidRequest(errors["replicas"])
    deployments.update(session, viewer.principal, name, version=forms.blank_none(form.get("version")),
                       replicas=replicas)
    session.flush()
    return fragment("deployment_replicas.html", **_deployment_values(request, session, viewer, name))


@router.post("/deployments/{name}/rollback")
def rollback(request: Request, name: str, session: SessionDep, viewer: ViewerDep) -> Response:
    viewer.may("POST", "/v1/deployments/{name}/rollback", name=name)
    deployments.rollback(session, viewer.principal, name)
    session.flush()
    return fragment("deployment_replicas.html", **_deployment_values(request, session, viewer, name))


@router.post("/deployments/{name}/delete")
def delete_deployment(request: Request, name: str, session: SessionDep, viewer: ViewerDep) -> Response:
    viewer.may("DELETE", "/v1/deployments/{name}", name=name)
    deployments.delete(session, viewer.principal, name)
    response = RedirectResponse("/deployments", status_code=303)
    if request.headers.get("hx-request"):
        response.headers["HX-Redirect"] = "/deployments"
    return response


@router.post("/deployments/{name}/predict")
async def predict(request: Request, name: str, viewer: ViewerDep) -> Response:
    """The test form: the signed-in user's predict, as through the API."""
    check_predict(viewer.principal)
    ctx = get_ctx(request)
    route = ctx.balancer.find(viewer.principal.tenant_id, name)
    if route is None:
        raise NotFound(f"no deployment {name!r} is serving in tenant {viewer.principal.tenant} yet")
    return await forward_predict(request, ctx.balancer, route.deployment_id, ctx.settings.predict_max_bytes)
