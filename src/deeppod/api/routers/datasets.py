from __future__ import annotations

import json
import re

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse

from deeppod.api.deps import PrincipalDep, SessionDep, get_ctx
from deeppod.api.schemas.datasets import DatasetOut, DatasetPatch, PolicyIn, StagedOut, TokenCountsOut, dataset_out
from deeppod.datasets import service
from deeppod.datasets.upload import ingest_request
from deeppod.errors import InvalidRequest
from deeppod.models import service as models

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])
UPLOAD_PATH = re.compile(r"^/v1/datasets/[^/]+/versions$")


def is_upload(method: str, path: str) -> bool:
    return method == "POST" and bool(UPLOAD_PATH.match(path))


def _json_param(name: str, raw: str | None) -> dict | None:
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        raise InvalidRequest(f"query parameter {name} must be a JSON object, e.g. {name}={{\"k\":\"v\"}}") from None
    if not isinstance(value, dict):
        raise InvalidRequest(f"query parameter {name} must be a JSON object")
    return value


def _show(session, principal, ref: str) -> DatasetOut:
    ds = service.get_dataset(session, principal, ref)
    return dataset_out(ds, service.owner_name(session, ds), service.versions(session, ds))


@router.post("/{name}/versions", status_code=201, response_model=DatasetOut)
async def ingest(name: str, request: Request, principal: PrincipalDep, policy: str | None = None,
                 tags: str | None = None, description: str | None = None,
                 source: str = Query("upload", max_length=1000)) -> DatasetOut:
    """Body: a tar, tar.gz or zip archive, streamed. Creates NAME@next, all or nothing."""
    ctx = get_ctx(request)
    policy_d, tags_d = _json_param("policy", policy), _json_param("tags", tags)
    await ingest_request(request, ctx.sessions, ctx.data, principal, name, policy=policy_d, tags=tags_d,
                         description=description, source=source)
    return await run_in_threadpool(_show_now, ctx, principal, name)


@router.post("/{name}/commit", status_code=201, response_model=DatasetOut)
async def commit(name: str, request: Request, principal: PrincipalDep) -> DatasetOut:
    """The files in the dataset's S3 inbox (s3://inbox/NAME/...) become its next version, through
    the same ingest as an upload; what the ingest refuses stays in the inbox."""
    from deeppod.s3 import inbox
    from deeppod.s3.namespace import Namespace

    ctx = get_ctx(request)
    ns = Namespace(ctx.data, ctx.settings.models_dir)
    await run_in_threadpool(inbox.commit, ctx.sessions, ns, principal, name, via=f"api by {principal.user}")
    return await run_in_threadpool(_show_now, ctx, principal, name)


def _show_now(ctx, principal, name: str) -> DatasetOut:
    with ctx.read_sessions() as s:
        return _show(s, principal, name)


@router.get("", response_model=list[DatasetOut])
def list_datasets(session: SessionDep, principal: PrincipalDep, q: str = "") -> list[DatasetOut]:
    return [dataset_out(ds, owner, vs) for ds, owner, vs in service.search(session, principal, q)]


@router.patch("/{name:path}", response_model=DatasetOut)
def update(name: str, body: DatasetPatch, session: SessionDep, principal: PrincipalDep) -> DatasetOut:
    service.update(session, principal, name, **body.model_dump())
    return _show(session, principal, name)


@router.put("/{name:path}/policy", response_model=DatasetOut)
def set_policy(name: str, body: PolicyIn, session: SessionDep, principal: PrincipalDep) -> DatasetOut:
    service.set_policy(session, principal, name, body.policy, replace=body.replace)
    return _show(session, principal, name)


@router.post("/{ref:path}/stage", response_model=StagedOut)
def stage(ref: str, request: Request, principal: PrincipalDep, tier: str = "hot") -> StagedOut:
    ctx = get_ctx(request)
    with ctx.sessions() as s:
        ds, v = service.get_version(s, principal, ref)
        if tier == "cold":
            service.get_dataset(s, principal, ref, write=True)
        name, number, version_id = ds.name, v.version, v.id
    if tier == "hot":
        path = service.stage(ctx.sessions, ctx.data, version_id)
    else:
        path = service.move_version(ctx.sessions, ctx.data, version_id, tier)
    return StagedOut(ref=f"{name}@{number}", tier=tier, path=path)


@router.delete("/{ref:path}")
def remove_version(ref: str, request: Request, principal: PrincipalDep) -> dict:
    ctx = get_ctx(request)
    return service.remove_version(ctx.sessions, ctx.data, principal, ref)


@router.get("/{ref:path}/manifest")
def manifest(ref: str, request: Request, session: SessionDep, principal: PrincipalDep) -> FileResponse:
    ds, v = service.get_version(session, principal, ref)
    path = get_ctx(request).data.tiers.path(v.tier, v.key) / "manifest.jsonl"
    return FileResponse(path, media_type="application/x-ndjson", filename=f"{ds.name}-v{v.version}.jsonl")


@router.get("/{ref:path}/tokens", response_model=TokenCountsOut)
def token_counts(ref: str, request: Request, session: SessionDep, principal: PrincipalDep,
                 model: str = Query(description="NAME@VERSION of a language model: its tokenizer counts")) -> dict:
    """How long a text version's examples are in a model's tokens, and how many exceed its context."""
    ctx = get_ctx(request)
    _, version = models.get_version(session, principal, model)
    return service.token_stats(session, principal, ctx.data, ref, version, model_ref=model,
                               models_root=ctx.settings.models_dir, cache_root=ctx.settings.hot_root / ".token-counts")


@router.get("/{ref:path}", response_model=DatasetOut)
def show(ref: str, session: SessionDep, principal: PrincipalDep) -> DatasetOut:
    return _show(session, principal, ref.split("@")[0])
