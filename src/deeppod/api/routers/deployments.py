from __future__ import annotations

import asyncio
import re

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response

from deeppod.api.deps import Id, PrincipalDep, SessionDep, bearer, get_ctx, principal_now
from deeppod.api.schemas.deployments import (
    AnnounceIn,
    DeploymentIn,
    DeploymentOut,
    DeploymentPatch,
    DirectIn,
    DirectOut,
    DirectReplicaOut,
    DirectSyncIn,
    DirectSyncOut,
    KeyIn,
    KeyOut,
    ReplicaOut,
)
from deeppod.audit.log import Entry
from deeppod.auth.roles import check_predict
from deeppod.auth.tokens import hash_secret
from deeppod.deployments import direct, page, service
from deeppod.deployments.forward import forward_predict
from deeppod.errors import NotFound, Unauthenticated

router = APIRouter(prefix="/v1/deployments", tags=["deployments"])
replicas_router = APIRouter(prefix="/v1/replicas", tags=["deployments"])
page_router = APIRouter(prefix="/ui/deployments", tags=["deployments"])
PREDICT_PATH = re.compile(r"^/v1/deployments/[^/]+/predict$")


def is_predict(method: str, path: str) -> bool:
    """Predict bodies (images) have their own, larger limit: DEEPPOD_PREDICT_MAX_BYTES."""
    return method == "POST" and bool(PREDICT_PATH.match(path))


def _out(request: Request, session, dep) -> DeploymentOut:
    ctx = get_ctx(request)
    d = service.describe(session, dep)
    route = ctx.balancer.routes.get(dep.id)
    routed = {t.job_id for t in route.targets} if route else set()
    base = ctx.settings.url
    return DeploymentOut(
        name=dep.name, model=d["model"], version=d["version"], previous_version=d["previous_version"],
        replicas=dep.replicas, gpus_per_replica=dep.gpus_per_replica, cpus_per_replica=dep.cpus_per_replica,
        max_batch=dep.max_batch, max_wait_ms=dep.max_wait_ms, state=dep.state, reason=dep.reason,
        predict_url=f"{base}/v1/deployments/{dep.name}/predict", page_url=f"{base}/deployments/{dep.name}#try-it",
        signature=d["signature"], created_at=dep.created_at, updated_at=dep.updated_at,
        replica_jobs=[ReplicaOut(**r, routed=r["job_id"] in routed, inflight=ctx.balancer.load(r["job_id"]))
                      for r in d["replica_jobs"]])


@router.post("", status_code=201, response_model=DeploymentOut)
def create(body: DeploymentIn, request: Request, session: SessionDep, principal: PrincipalDep) -> DeploymentOut:
    dep = service.create(session, principal, body.name or body.model.split("@")[0].split("/")[-1], body.model,
                         replicas=body.replicas, gpus_per_replica=body.gpus_per_replica,
                         cpus_per_replica=body.cpus_per_replica, max_batch=body.max_batch, max_wait_ms=body.max_wait_ms)
    return _out(request, session, dep)


@router.get("", response_model=list[DeploymentOut])
def list_deployments(request: Request, session: SessionDep, principal: PrincipalDep) -> list[DeploymentOut]:
    return [_out(request, session, d) for d in service.list_deployments(session, principal)]


@router.get("/{name}", response_model=DeploymentOut)
def show(name: str, request: Request, session: SessionDep) -> DeploymentOut | HTMLResponse:
    """JSON for clients; a browser (Accept: text/html, no token) gets the test page."""
    if "text/html" in request.headers.get("accept", "") and "authorization" not in request.headers:
        return HTMLResponse(page.render(name))
    return _out(request, session, service.get(session, principal_now(request), name))


@router.patch("/{name}", response_model=DeploymentOut)
def update(name: str, body: DeploymentPatch, request: Request, session: SessionDep,
           principal: PrincipalDep) -> DeploymentOut:
    dep = service.update(session, principal, name, **body.model_dump())
    return _out(request, session, dep)


@router.post("/{name}/rollback", response_model=DeploymentOut)
def rollback(name: str, request: Request, session: SessionDep, principal: PrincipalDep) -> DeploymentOut:
    return _out(request, session, service.rollback(session, principal, name))


@router.delete("/{name}", status_code=204)
def delete(name: str, session: SessionDep, principal: PrincipalDep) -> Response:
    service.delete(session, principal, name)
    return Response(status_code=204)


@router.post("/{name}/keys", status_code=201, response_model=KeyOut)
def create_key(name: str, body: KeyIn, session: SessionDep, principal: PrincipalDep) -> KeyOut:
    key, secret = service.create_key(session, principal, name, body.name)
    return KeyOut(id=key.id, name=key.name, created_at=key.created_at, key=secret)


@router.get("/{name}/keys", response_model=list[KeyOut])
def list_keys(name: str, session: SessionDep, principal: PrincipalDep) -> list[KeyOut]:
    return [KeyOut.model_validate(k) for k in service.list_keys(session, principal, name)]


@router.delete("/{name}/keys/{key_id}", response_model=KeyOut)
def revoke_key(name: str, key_id: Id, session: SessionDep, principal: PrincipalDep) -> KeyOut:
    return KeyOut.model_validate(service.revoke_key(session, principal, name, key_id))


@router.post("/{name}/direct", response_model=DirectOut)
def direct_token(name: str, request: Request, session: SessionDep, body: DirectIn | None = None) -> DirectOut:
    """A token to call the deployment's replicas directly, past the control plane (whoever may
    call its predict may ask: a token of its tenant or one of its keys), and where they are."""
    issued, principal = direct.issue(session, name, key=request.headers.get("x-deeppod-key", ""),
                                     secret=bearer(request) or "", ttl=body.ttl_seconds if body else direct.TTL_SECONDS)
    if principal is not None:
        request.state.principal = principal  # the audit log's who
    route = get_ctx(request).balancer.routes.get(issued.deployment.id)
    return DirectOut(token=issued.token, token_id=issued.jti, expires_at=issued.expires_at,
                     replicas=[DirectReplicaOut(job_id=t.job_id, url=t.url, version=t.version)
                               for t in (route.targets if route else ())])


@router.delete("/{name}/direct")
def revoke_direct(name: str, session: SessionDep, principal: PrincipalDep) -> dict:
    """Revoke every direct token of the deployment (replicas refuse them within a second)."""
    return {"revoked": direct.revoke_all(session, principal, name)}


@router.get("/{name}/metrics", response_class=PlainTextResponse)
async def metrics(name: str, request: Request) -> PlainTextResponse:
    """Prometheus text: the router's figures and every routed replica's."""
    ctx = get_ctx(request)
    dep_id = await authorize(request, name)
    text = ctx.balancer.render_metrics(dep_id, name) + await ctx.balancer.replica_metrics(dep_id)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


async def authorize(request: Request, name: str) -> int:
    """A token of the deployment's tenant, or one of its keys: the deployment's id."""
    ctx = get_ctx(request)
    key = request.headers.get("x-deeppod-key")
    secret = bearer(request) or ""
    if key or secret.startswith(service.KEY_PREFIX):
        dep_id = ctx.balancer.keys.get(hash_secret(key or secret))
        route = ctx.balancer.routes.get(dep_id) if dep_id is not None else None
        if route is None or route.name != name:
            raise Unauthenticated(f"this key is unknown, revoked, or not a key of deployment {name!r}")
        return dep_id
    if not secret:
        raise Unauthenticated("predict needs a token of the tenant ('Authorization: Bearer ...') or a deployment key "
                              "('X-DeepPod-Key: ...', from 'deeppod deploy key create NAME')")
    principal = ctx.principals.cached(secret)
    if principal is None:
        raise Unauthenticated("the token is unknown or revoked")
    if principal is False:
        principal = await run_in_threadpool(ctx.principals.lookup, secret)
    elif ctx.principals.claim_refresh(secret):
        asyncio.get_running_loop().run_in_executor(None, ctx.principals.refresh, secret)
    check_predict(principal)
    request.state.principal = principal
    route = ctx.balancer.find(principal.tenant_id, name)
    if route is None:
        raise NotFound(f"no deployment {name!r} in tenant {principal.tenant}: list them with 'deeppod deploy ls' "
                       "(a new deployment takes a moment to appear)")
    return route.deployment_id


@router.post("/{name}/predict")
async def predict(name: str, request: Request) -> Response:
    """Body: multipart field 'image' (one or more), raw image bytes (Content-Type image/*), or JSON
    {"images": [base64...]} / {"tensors": [...]}; query or field top_k. Answers the top-k labels with
    confidences, and the model version that answered."""
    dep_id = await authorize(request, name)
    ctx = get_ctx(request)
    return await forward_predict(request, ctx.balancer, dep_id, ctx.settings.predict_max_bytes)


@replicas_router.put("/{job_id}")
def announce(job_id: Id, body: AnnounceIn, session: SessionDep, principal: PrincipalDep) -> dict:
    """A replica (with its job token) says where it listens."""
    job = service.announce(session, principal, job_id, body.url)
    return {"job_id": job.id, "url": job.endpoint}


@replicas_router.post("/{job_id}/direct", response_model=DirectSyncOut)
def direct_sync(job_id: Id, body: DirectSyncIn, request: Request, session: SessionDep,
                principal: PrincipalDep) -> DirectSyncOut:
    """A replica (with its job token) reports its direct predictions and refusals, and hears
    which direct tokens are revoked."""
    dep, revoked = direct.sync(session, principal, job_id)
    ctx = get_ctx(request)
    ctx.balancer.count_direct(dep.id, [u.model_dump() for u in body.usage])
    for r in body.refused:  # refused predictions are audited, as the router's are
        ctx.audit.record(Entry("POST", f"/v1/deployments/{dep.name}/predict (direct, {r.code})", r.status,
                               r.client, r.user, principal.tenant, "direct"))
    return DirectSyncOut(revoked=revoked)


@page_router.get("/{name}", response_class=HTMLResponse)
def test_page(name: str) -> HTMLResponse:
    return HTMLResponse(page.render(name))


@router.get("/{name}/page", include_in_schema=False)
def to_page(name: str) -> RedirectResponse:
    return RedirectResponse(f"/ui/deployments/{name}")
