"""Console pages for models: versions with metrics and lineage, two versions side by side
(with a comparison job on the same data), promote, deploy (the deployment's pages:
deployments.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from deeppod.api.deps import SessionDep, get_ctx
from deeppod.deployments import service as deployments
from deeppod.errors import InvalidRequest, Rerender
from deeppod.models import service as models
from deeppod.models.compare import better_side
from deeppod.ui import forms
from deeppod.ui.auth import ViewerDep
from deeppod.ui.render import ConsoleRoute, page

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)
@router.get("/models")
def model_list(request: Request, session: SessionDep, viewer: ViewerDep) -> Response:
    rows = [(m, models.owner_names(session, m)[0], vs) for m, vs in models.list_models(session, viewer.principal)]
    return page(request, "models.html", rows=rows)


def _model_values(session, viewer, name: str) -> dict:
    model = models.get_model(session, viewer.principal, name)
    versions = models.versions(session, model)
    by_id = {v.id: v.version for v in versions}
    numeric = {k for v in versions for k, x in (v.metrics or {}).items() if isinstance(x, (int, float))}
    first = [k for k in ("val_accuracy", "accuracy", "val_loss", "loss") if k in numeric]
    metric_names = first + sorted(numeric - set(first))
    hyper = [(v.lineage or {}).get("hyperparameters") or {} for v in versions]
    differ = sorted(k for k in set().union(*hyper) if len({repr(h.get(k)) for h in hyper}) > 1)
    return dict(model=model, owner=models.owner_names(session, model)[0], versions=versions[::-1],
                metric_names=metric_names[:5], differ=differ, evaluations=models.evaluations(session,
                                                                                             model), by_id=by_id,
                deployments=[d for d in deployments.list_deployments(session,
                                                                     viewer.principal) if d.model_id == model.id])


@router.get("/models/{name}")
def model_page(request: Request, name: str, session: SessionDep, viewer: ViewerDep) -> Response:
    return page(request, "model.html", message=None, **_model_values(session, viewer, name))


@router.get("/models/{name}/compare")
def compare_page(request: Request, name: str, session: SessionDep, viewer: ViewerDep, a: str = "",
                 b: str = "") -> Response:
    model = models.get_model(session, viewer.principal, name)
    if not a or not b:
        raise InvalidRequest("choose two versions to compare (a and b)")
    va, vb = models.resolve(session, model, a), models.resolve(session, model, b)
    keys = sorted({*(va.metrics or {}), *(vb.metrics or {})})
    params = sorted({*((va.lineage or {}).get("hyperparameters") or {}),
                     *((vb.lineage or {}).get("hyperparameters") or {})} - {"dataset"})  # a row of its own
    evals = [e for e in models.evaluations(session, model) if e.version_id in (va.id, vb.id)]
    better = {k: better_side(k, (va.metrics or {}).get(k), (vb.metrics or {}).get(k)) for k in keys}
    return page(request, "compare.html", model=model, a=va, b=vb, keys=keys, params=params, evaluations=evals,
                better=better, by_id={va.id: va.version, vb.id: vb.version}, errors={})


@router.post("/models/{name}/compare")
def run_comparison(request: Request, name: str, session: SessionDep, viewer: ViewerDep,
                   form: forms.FormDep) -> Response:
    viewer.may("POST", "/v1/models/{name}/comparisons", name=name)
    data = (form.get("data") or "").strip()
    if not data:
        raise InvalidRequest("name the dataset version to evaluate both on, e.g. digits@1")
    settings = get_ctx(request).settings
    job, _, _ = models.compare(session, viewer.principal, name, form.get("a", ""), form.get("b", ""), data,
                               root=settings.models_dir, jobs_dir=settings.jobs_dir,
                               default_grace=settings.grace_seconds)
    return RedirectResponse(f"/jobs/{job.id}", status_code=303)


@router.post("/models/{name}/promote")
def promote(request: Request, name: str, session: SessionDep, viewer: ViewerDep, form: forms.FormDep) -> Response:
    viewer.may("POST", "/v1/models/{name}/promote", name=name)
    _, version, why = models.promote(session, viewer.principal, name, form.get("version", ""),
                                     force=form.get("force") == "on")
    session.flush()
    return page(request, "model.html", message=f"v{version.version} is the champion: {why}",
                **_model_values(session, viewer, name))


@router.post("/models/{name}/deploy")
def deploy(request: Request, name: str, session: SessionDep, viewer: ViewerDep, form: forms.FormDep) -> Response:
    viewer.may("POST", "/v1/deployments")
    errors: dict[str, str] = {}
    replicas = forms.number(errors, "replicas", form.get("replicas")) or 1
    dep_name = (form.get("deployment") or name).strip()
    try:
        if errors:
            raise forms.FormErrors(errors)
        try:
            dep = deployments.create(session, viewer.principal, dep_name, f"{name}@{form.get('version', '')}",
                                     replicas=replicas)
        except InvalidRequest as exc:
            raise forms.FormErrors({"deployment" if "name" in exc.message else "replicas": exc.message},
                                   exc.status) from None
    except forms.FormErrors as exc:
        values = _model_values(session, viewer, name)
        raise Rerender(page(request, "model.html", status=exc.status, message=None, deploy_errors=exc.errors,
                            deploy_values=form, **values)) from None
    return RedirectResponse(f"/deployments/{dep.name}", status_code=303)
