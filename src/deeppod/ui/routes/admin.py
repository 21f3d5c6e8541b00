"""The console's admin page: tenants, users (their first token shown once), tokens and S3
access keys (create, revoke), sizing a cluster for a workload, the plan tree (edit as YAML
and apply), and cordon / uncordon on the cluster page. Each shows what the caller's role may
do and calls the service the API calls."""

from __future__ import annotations

from functools import partial

import yaml
from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from deeppod.api.deps import Id, SessionDep, get_ctx
from deeppod.api.hangup import in_thread_until_gone
from deeppod.api.schemas.access_keys import AccessKeyCreate
from deeppod.api.schemas.plans import PlanIn
from deeppod.api.schemas.sizing import SizingIn
from deeppod.api.schemas.tenants import TenantCreate
from deeppod.api.schemas.tokens import TokenCreate
from deeppod.api.schemas.users import UserCreate
from deeppod.auth import roles
from deeppod.auth import service as auth
from deeppod.cluster import burst
from deeppod.cluster import service as cluster
from deeppod.errors import DeepPodError, InvalidRequest, Rerender
from deeppod.plans import service as plans
from deeppod.s3 import access_keys
from deeppod.s3.app import endpoint_of
from deeppod.sizing import Workload
from deeppod.sizing import service as sizing
from deeppod.ui import forms
from deeppod.ui.auth import Viewer, ViewerDep
from deeppod.ui.render import ConsoleRoute, page

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)
EXPIRY_DAYS = {"": None, "1": 1, "7": 7, "30": 30, "90": 90, "365": 365}


def _values(session, viewer: Viewer) -> dict:
    p = viewer.principal
    manages = auth.managed_tenants(session, p)
    plan, row = plans.current_plan(session)
    return dict(
        tenants=auth.list_tenants(session, p) if p.is_admin else [],
        users=auth.list_users(session, p) if manages is None or manages else [],
        tokens=auth.list_tokens(session, p), keys=access_keys.list_keys(session, p), key_scopes=access_keys.SCOPES,
        roles=roles.ROLES, scopes=roles.SCOPES, manages=manages,
        plan_yaml=yaml.safe_dump(plan.to_dict(), sort_keys=False) if plan.to_dict().get("tenants") else
        "tenants:\n  - name: default\n    guaranteed: 0\n", plan_row=row,
        can_plan=p.role in (roles.ADMIN, roles.TENANT_ADMIN))


def _page(request, session, viewer, status: int = 200, **extra) -> Response:
    values = {**_values(session, viewer), "errors": {}, "form": {}, "secret": None, "message": None, "s3": None,
              "warnings": (), **extra}
    return page(request, "admin.html", status=status, **values)


@router.get("/admin")
def admin(request: Request, session: SessionDep, viewer: ViewerDep) -> Response:
    return _page(request, session, viewer)


def _refused(request, session, viewer, errors: dict, form: dict, status: int = 422):
    """Refused: the page again with the message by its field; the transaction is undone."""
    return Rerender(_page(request, session, viewer, status=status, errors=errors, form=form))


@router.post("/admin/tenants")
def create_tenant(request: Request, session: SessionDep, viewer: ViewerDep, form: forms.FormDep) -> Response:
    viewer.may("POST", "/v1/tenants")
    isolated = get_ctx(request).settings.isolation != "one-tenant"
    try:
        tenant = forms.checked_call(TenantCreate, {"name": form.get("tenant", "").strip()}, {}, {"name": "tenant"},
                                    lambda b: auth.create_tenant(session, viewer.principal, b.name, isolated=isolated),
                                    {"": "tenant"})  # every refusal is about the one field
    except forms.FormErrors as exc:
        raise _refused(request, session, viewer, exc.errors, form, exc.status) from None
    session.flush()
    return _page(request, session, viewer, message=f"tenant {tenant.name} created")


@router.post("/admin/users")
def create_user(request: Request, session: SessionDep, viewer: ViewerDep, form: forms.FormDep) -> Response:
    viewer.may("POST", "/v1/users")
    try:
        user, secret = forms.checked_call(
            UserCreate, {"name": form.get("user", "").strip(), "tenant": form.get("user_tenant", ""),
                         "role": form.get("role", "member")}, {}, {"name": "user", "tenant": "user_tenant",
                                                                   "role": "role"},
            lambda b: auth.create_user(session, viewer.principal, b.name, b.tenant, b.role),
            {"tenant": "user_tenant", "role": "role", "user": "user"})
    except forms.FormErrors as exc:
        raise _refused(request, session, viewer, exc.errors, form, exc.status) from None
    session.flush()
    return _page(request, session, viewer, message=f"user {user.name} created; their first token (shown once):",
                 secret=secret)


@router.post("/admin/users/{name}/role")
def set_role(request: Request, name: str, session: SessionDep, viewer: ViewerDep, form: forms.FormDep) -> Response:
    viewer.may("PATCH", "/v1/users/{name}", name=name)
    user, _ = auth.set_role(session, viewer.principal, name, roles.check_role(form.get("role", "")))
    session.flush()
    return _page(request, session, viewer, message=f"{user.name} is now {user.role}")


@router.post("/admin/tokens")
def create_token(request: Request, session: SessionDep, viewer: ViewerDep, form: forms.FormDep) -> Response:
    viewer.may("POST", "/v1/tokens")
    errors: dict[str, str] = {}
    try:
        seconds = _days(form, errors)
        token, secret = forms.checked_call(
            TokenCreate, {"name": form.get("token_name", ""), "scope": form.get("scope", "all"),
                          "user": forms.blank_none(form.get("token_user")), "expires_in": seconds},
            errors, {"name": "token_name", "scope": "scope", "user": "token_user"},
            lambda b: auth.create_token(session, viewer.principal, b.name, b.user, scope=b.scope,
                                        expires_in=b.expires_in),
            {"user": "token_user", "scope": "scope"})
    except forms.FormErrors as exc:
        raise _refused(request, session, viewer, exc.errors, form, exc.status) from None
    session.flush()
    return _page(request, session, viewer, message=f"token {token.name or token.id} created (shown once):",
                 secret=secret)


@router.post("/admin/tokens/{token_id}/revoke")
def revoke_token(request: Request, token_id: Id, session: SessionDep, viewer: ViewerDep) -> Response:
    viewer.may("DELETE", "/v1/tokens/{token_id}", token_id=token_id)
    auth.revoke_token(session, viewer.principal, token_id)
    session.flush()
    return _page(request, session, viewer, message=f"token {token_id} revoked")


def _days(form: dict, errors: dict, field: str = "expires_days") -> float | None:
    """The form's expiry choice in seconds (None: never); a bad choice noted in ``errors``."""
    days = form.get(field, "")
    if days not in EXPIRY_DAYS:
        errors[field] = "choose how long it lives"
    return EXPIRY_DAYS.get(days) and EXPIRY_DAYS[days] * 86400


@router.post("/admin/access-keys")
def create_access_key(request: Request, session: SessionDep, viewer: ViewerDep, form: forms.FormDep) -> Response:
    """An S3 access key for the viewer: its secret shown once, with the endpoint and how to use it."""
    viewer.may("POST", "/v1/access-keys")
    errors: dict[str, str] = {}
    try:
        seconds = _days(form, errors, "key_expires_days")
        key, secret = forms.checked_call(
            AccessKeyCreate, {"name": form.get("key_name", ""), "scope": form.get("key_scope", "write"),
                              "expires_in": seconds},
            errors, {"name": "key_name", "scope": "key_scope"},
            lambda b: access_keys.create(session, viewer.principal, scope=b.scope, name=b.name,
                                         expires_in=b.expires_in),
            {"scope": "key_scope"})
    except forms.FormErrors as exc:
        raise _refused(request, session, viewer, exc.errors, form, exc.status) from None
    session.flush()
    return _page(request, session, viewer, message=f"S3 access key {key.key_id} created; its secret (shown once):",
                 secret=secret, s3={"key_id": key.key_id, "secret": secret, "endpoint": endpoint_of(request)})


@router.post("/admin/access-keys/{key_id}/revoke")
def revoke_access_key(request: Request, key_id: str, session: SessionDep, viewer: ViewerDep) -> Response:
    viewer.may("DELETE", "/v1/access-keys/{key_id}", key_id=key_id)
    access_keys.revoke(session, viewer.principal, key_id)
    session.flush()
    return _page(request, session, viewer, message=f"S3 access key {key_id} revoked")


# the form's fields, as ``deeppod size`` names them; an example workload (ImageNet, ResNet-50) to start from
SIZING_FIELDS = ("images", "epochs", "hours", "images_per_gpu", "image_kb", "users", "runs_per_user_day",
                 "wait_minutes", "job_gpus", "inference_rps", "rps_per_gpu", "gpus_per_node")
SIZING_EXAMPLE = {"images": "1281167", "epochs": "90", "hours": "24", "images_per_gpu": "2900", "image_kb": "110",
                  "users": "10", "runs_per_user_day": "1", "wait_minutes": "30", "gpus_per_node": "8"}


@router.get("/admin/size")
async def size(request: Request, viewer: ViewerDep) -> Response:
    """How many GPUs, nodes, cores and how much storage a workload needs (a GET: it changes
    nothing, and the answer's address can be kept and shared)."""
    viewer.may("POST", "/v1/sizing")
    sizing.check_may(viewer.principal)
    form = {k: v for k, v in request.query_params.items() if k in SIZING_FIELDS}
    if not form:
        return page(request, "size.html", form=SIZING_EXAMPLE, errors={}, result=None)
    try:
        body = forms.validated(SizingIn, {k: v for k, v in form.items() if v.strip()}, {},
                               {k: k for k in SIZING_FIELDS})
        within = partial(sizing.recommend, budget_s=get_ctx(request).settings.sizing_budget_seconds)
        result = await in_thread_until_gone(request, within, viewer.principal, Workload(**body.model_dump()))
    except forms.FormErrors as exc:
        return page(request, "size.html", status=exc.status, form=form, errors=exc.errors, result=None)
    except DeepPodError as exc:
        return page(request, "size.html", status=exc.status, form=form, errors={"_form": exc.message}, result=None)
    return page(request, "size.html", form=form, errors={}, result=result.as_dict())


@router.post("/admin/plan")
def apply_plan(request: Request, session: SessionDep, viewer: ViewerDep, form: forms.FormDep) -> Response:
    viewer.may("PUT", "/v1/plan")
    text = form.get("plan", "")
    try:
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise forms.FormErrors({"plan": f"the plan is not valid YAML: {str(exc).splitlines()[0]}"}) from None
        if not isinstance(doc, dict):
            raise forms.FormErrors({"plan": "write the plan as 'tenants:' followed by a list of tenants"})
        body = forms.validated(PlanIn, doc, {}, {"tenants": "plan"})
        try:
            row = plans.apply_plan(session, viewer.principal, body.model_dump(exclude_none=True))
        except DeepPodError as exc:
            raise forms.FormErrors({"plan": exc.message}, exc.status) from None
    except forms.FormErrors as exc:
        raise Rerender(_page(request, session, viewer, status=exc.status, errors=exc.errors, form=form,
                             plan_yaml=text)) from None
    session.flush()
    return _page(request, session, viewer, message="plan applied: the scheduler uses it from its next round",
                 warnings=burst.plan_warnings(row.document, get_ctx(request).jobs.bursting))


@router.post("/cluster/nodes/{name}/health")
def node_health(request: Request, name: str, session: SessionDep, viewer: ViewerDep, form: forms.FormDep) -> Response:
    viewer.may("PATCH", "/v1/nodes/{name}", name=name)
    gpu = form.get("gpu", "").strip()
    if gpu and not gpu.isdigit():
        raise InvalidRequest(f"GPU {gpu!r} is not a GPU index")
    cluster.set_health(session, viewer.principal, name, form.get("healthy") == "yes", int(gpu) if gpu else None)
    return RedirectResponse("/cluster", status_code=303)
