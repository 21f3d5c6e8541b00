"""The labeling page: assign or correct each image's class with the keyboard, ask a deployed
model to propose a class and confidence for every image, sort by confidence, and save the
result as the dataset's next immutable version, its lineage naming the version it came
from and the model that helped."""

from __future__ import annotations

import base64
import json

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from deeppod.api.deps import SessionDep, get_ctx
from deeppod.auth import scope
from deeppod.auth.roles import check_predict
from deeppod.datasets import service
from deeppod.datasets.labeling import Workspace
from deeppod.deployments import service as deployments
from deeppod.errors import InvalidRequest, NotFound
from deeppod.models import service as models
from deeppod.ui.auth import ViewerDep
from deeppod.ui.render import ConsoleRoute, page

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)
PROPOSE_BATCH = 64  # images per proposal request (the replica takes up to 256)
LABELING_PREFIX = "labeling-"  # the deployment a champion proposes labels from


def _workspace(request: Request, session, viewer, ref: str):
    ds, v = service.get_version(session, viewer.principal, ref)
    owner = service.owner_name(session, ds)
    plane = get_ctx(request).data
    return ds, v, owner, Workspace(plane.tiers.path(v.tier, v.key), v.report or {})


@router.get("/datasets/{ref:path}/label")
def label_page(request: Request, ref: str, session: SessionDep, viewer: ViewerDep) -> Response:
    ds, v, owner, _ = _workspace(request, session, viewer, ref)
    mine = viewer.principal
    serving = [d for d in deployments.list_deployments(session, mine) if scope.owns(mine, d)]
    champions = [(m.name, m.aliases[models.CHAMPION]) for m, _ in models.list_models(session, mine)
                 if scope.owns(mine, m) and models.CHAMPION in (m.aliases or {})]
    return page(request, "label.html", ds=ds, v=v, owner=owner, base=f"/datasets/{owner}/{ds.name}@{v.version}",
                deployments=serving, champions=champions, can_save=viewer.can("POST", "/v1/datasets/{name}/versions",
                                                                              name=ds.name)
                and scope.may_see(mine, ds))


@router.get("/datasets/{ref:path}/label/items.json")
def label_items(request: Request, ref: str, session: SessionDep, viewer: ViewerDep) -> Response:
    _, v, _, ws = _workspace(request, session, viewer, ref)
    items = ws.items()
    classes = sorted(set(v.classes) | {i.label for i in items if i.label})
    return JSONResponse({"classes": classes, "items": [[i.key, i.path, i.label] for i in items]})


@router.get("/datasets/{ref:path}/label/image")
async def label_image(request: Request, ref: str, key: str, session: SessionDep, viewer: ViewerDep) -> Response:
    _, _, _, ws = _workspace(request, session, viewer, ref)
    data = await run_in_threadpool(ws.read, key)
    kind = "png" if data[:4] == b"\x89PNG" else "jpeg" if data[:2] == b"\xff\xd8" else "octet-stream"
    return Response(data, media_type=f"image/{kind}" if kind != "octet-stream" else "application/octet-stream",
                    headers={"Cache-Control": "private, max-age=86400", "X-Content-Type-Options": "nosniff"})


@router.post("/datasets/{ref:path}/label/propose")
async def propose(request: Request, ref: str, session: SessionDep, viewer: ViewerDep) -> Response:
    """One batch of proposals: {"deployment", "keys": [...]} -> {key: [label, confidence]}."""
    check_predict(viewer.principal)
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        raise InvalidRequest("send JSON: {\"deployment\": NAME, \"keys\": [...]}") from None
    keys, name = body.get("keys"), body.get("deployment")
    if not isinstance(name, str) or not isinstance(keys, list) or not 0 < len(keys) <= PROPOSE_BATCH:
        raise InvalidRequest(f"send a deployment's name and 1-{PROPOSE_BATCH} image keys")
    # off the event loop: the request's session waits its turn for the SQLite writer
    _, _, _, ws = await run_in_threadpool(_workspace, request, session, viewer, ref)
    ctx = get_ctx(request)
    route = ctx.balancer.find(viewer.principal.tenant_id, name)
    if route is None:
        raise NotFound(f"deployment {name!r} is not serving in tenant {viewer.principal.tenant}: deploy a model "
                       "(its page has a Deploy form) and wait until it is ready")
    images = await run_in_threadpool(lambda: [base64.b64encode(ws.read(str(k))).decode() for k in keys])
    answer = await ctx.balancer.forward(route.deployment_id, "/predict?top_k=1",
                                      json.dumps({"images": images}).encode(), "application/json")
    try:
        doc = json.loads(answer.body)
    except ValueError:
        doc = {}
    if answer.status != 200:
        why = (doc.get("error") or {}).get("message") or f"the replica answered {answer.status}"
        raise InvalidRequest(f"deployment {name!r} could not label these images: {why}", status=502
                             if answer.status >= 500 else 422)
    out = {str(k): [p["top_k"][0]["label"], round(p["top_k"][0]["confidence"], 4)]
           for k, p in zip(keys, doc["predictions"])}
    return JSONResponse({"model": f"{route.model}", "version": doc.get("version"), "proposals": out})


@router.post("/datasets/{ref:path}/label/serve")
async def serve_champion(request: Request, ref: str, session: SessionDep, viewer: ViewerDep) -> Response:
    """A model's champion has no deployment: start one (LABELING_PREFIX + model, one replica)
    for the proposals, or find the one started before. Its name; the page waits for it."""
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        body = {}
    return await run_in_threadpool(_serve_champion, session, viewer, ref, body.get("model"))


def _serve_champion(session, viewer, ref: str, name: object) -> Response:
    """In the thread pool: the request's session waits its turn for the SQLite writer."""
    if not isinstance(name, str) or not name:
        raise InvalidRequest("name the model whose champion should propose labels")
    service.get_version(session, viewer.principal, ref)  # the caller may read the version
    viewer.may("POST", "/v1/deployments")
    model = models.get_model(session, viewer.principal, name)
    if models.CHAMPION not in (model.aliases or {}):
        raise InvalidRequest(f"model {name!r} has no champion: promote a version first")
    dep_name = f"{LABELING_PREFIX}{model.name}"[:63]
    existing = {d.name: d for d in deployments.list_deployments(session, viewer.principal)
                if scope.owns(viewer.principal, d)}
    if dep_name not in existing:
        deployments.create(session, viewer.principal, dep_name, f"{model.name}@{models.CHAMPION}", replicas=1)
    elif existing[dep_name].version_id != models.resolve(session, model, models.CHAMPION).id:
        deployments.update(session, viewer.principal, dep_name, version=models.CHAMPION)
    return JSONResponse({"deployment": dep_name, "url": f"/deployments/{dep_name}"})


@router.post("/datasets/{ref:path}/label/save")
async def save(request: Request, ref: str, viewer: ViewerDep) -> Response:
    """{"labels": {key: label or null}, "model": "what proposed labels" or null} -> the new version."""
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        raise InvalidRequest("send JSON: {\"labels\": {KEY: LABEL}}") from None
    changes, helper = body.get("labels"), body.get("model")
    if not isinstance(changes, dict) or not changes:
        raise InvalidRequest("nothing to save: change or confirm at least one label first")
    with get_ctx(request).read_sessions() as session:  # ended before the ingest (it writes in sessions of its own)
        ds, v, owner, ws = _workspace(request, session, viewer, ref)
    viewer.may("POST", "/v1/datasets/{name}/versions", name=ds.name)
    if not scope.owns(viewer.principal, ds):
        raise InvalidRequest(f"dataset {owner}/{ds.name} belongs to another tenant: you can read it, not add versions")
    plane = get_ctx(request).data
    archive = plane.spool()
    try:
        counts = await run_in_threadpool(ws.write_archive, changes, archive)
        lineage = {"labeled_from": f"{ds.name}@{v.version}", "labeled_by": viewer.principal.user,
                   "label_changes": counts, **({"labels_proposed_by": str(helper)[:200]} if helper else {})}
        await run_in_threadpool(service.ingest_upload, get_ctx(request).sessions, plane, viewer.principal, ds.name,
                                archive, description=None, source=f"labeling of {ds.name}@{v.version}",
                                lineage=lineage)
    finally:
        archive.unlink(missing_ok=True)
    new = await run_in_threadpool(_newest, get_ctx(request), viewer, f"{owner}/{ds.name}")
    return JSONResponse({"ref": f"{ds.name}@{new.version}", "counts": counts,
                         "url": f"/datasets/{owner}/{ds.name}@{new.version}"})


def _newest(ctx, viewer, ref: str):
    """In the thread pool, a read: never the event loop waiting for the database's writer."""
    with ctx.read_sessions() as s:
        return service.get_version(s, viewer.principal, ref)[1]
