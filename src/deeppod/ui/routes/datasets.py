"""Console pages for datasets: the catalog with search (the CLI's query language), a
version's page (class statistics, sizes, a thumbnail gallery, quarantined files and why,
lineage) and ingesting an archive from the browser with a progress bar."""

from __future__ import annotations

import math
import re
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, JSONResponse, Response

from deeppod.api.deps import SessionDep, get_ctx
from deeppod.datasets import service, text
from deeppod.datasets.images import VersionImages, thumbnail
from deeppod.datasets.upload import ingest_request
from deeppod.errors import InvalidRequest
from deeppod.models import service as models
from deeppod.ui.auth import ViewerDep
from deeppod.ui.render import ConsoleRoute, page, page_number

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)

GALLERY = 60
EXAMPLES = 20  # text examples per page
UPLOAD_PATH = re.compile(r"^/datasets/[^/]+/upload$")


def is_upload(method: str, path: str) -> bool:
    """The browser's archive upload is streamed to disk: the per-ingest limit applies, not the body limit."""
    return method == "POST" and bool(UPLOAD_PATH.match(path))


@router.get("/datasets")
def catalog(request: Request, session: SessionDep, viewer: ViewerDep, q: str = "") -> Response:
    try:
        rows, error = service.search(session, viewer.principal, q), None
    except InvalidRequest as exc:  # shown by the search box, the catalog unfiltered
        rows, error = service.search(session, viewer.principal, ""), exc.message
    return page(request, "datasets.html", rows=rows, q=q, error=error)


@router.get("/datasets/new")
def new_dataset(request: Request, viewer: ViewerDep) -> Response:
    return page(request, "dataset_new.html")


@router.post("/datasets/{name}/upload")
async def upload(request: Request, name: str, viewer: ViewerDep, val: str = "", description: str = "") -> Response:
    """The body is the archive itself (the page sends it with a progress bar)."""
    viewer.may("POST", "/v1/datasets/{name}/versions", name=name)
    policy = None
    if val.strip():
        try:
            fraction = float(val)
        except ValueError:
            raise InvalidRequest(f"validation share {val!r} is not a number: write e.g. 0.2") from None
        policy = {"val": fraction}
    ctx = get_ctx(request)
    await ingest_request(request, ctx.sessions, ctx.data, viewer.principal, name, policy=policy,
                         description=description or None, source="console upload")
    return await run_in_threadpool(_uploaded, ctx, viewer, f"{viewer.principal.tenant}/{name}")


def _uploaded(ctx, viewer, ref: str) -> Response:
    """In the thread pool, a read: never the event loop waiting for the database's writer."""
    with ctx.read_sessions() as s:
        ds, v, owner = _version(s, viewer, ref)
        return JSONResponse({"ref": f"{ds.name}@{v.version}", "samples": v.samples, "classes": len(v.classes),
                             "quarantined": len((v.report or {}).get("quarantined", [])),
                             "url": f"/datasets/{owner}/{ds.name}@{v.version}"})


def _version(session, viewer, ref: str):
    ds, v = service.get_version(session, viewer.principal, ref)
    return ds, v, service.owner_name(session, ds)


def _images(request: Request, v) -> VersionImages:
    plane = get_ctx(request).data
    return VersionImages(plane.tiers.path(v.tier, v.key))


@router.get("/datasets/{ref:path}/thumbs/{index}")
async def thumb(request: Request, ref: str, index: int, session: SessionDep, viewer: ViewerDep) -> Response:
    ds, v, _ = _version(session, viewer, ref)
    images = _images(request, v)
    img = images.image(index)
    cache = get_ctx(request).settings.hot_root / ".thumbnails"
    path = await run_in_threadpool(thumbnail, cache, img.sha256, lambda: images.read(index))
    # content-addressed: the same URL of the same version always shows the same picture
    return FileResponse(path, media_type="image/jpeg", headers={"Cache-Control": "private, max-age=86400"})


@router.get("/datasets/{ref:path}")
def version_page(request: Request, ref: str, session: SessionDep, viewer: ViewerDep, label: str = "",
                 tokenizer: str = "") -> Response:
    ds, v, owner = _version(session, viewer, ref)
    number = page_number(request)
    if label and label not in v.classes:
        raise InvalidRequest(f"{ds.name}@{v.version} has no class {label!r}; its classes: {', '.join(v.classes[:30])}")
    stats = v.stats or {}
    is_text = stats.get("kind") == "text"
    language_models, token_counts = [], None
    if is_text:
        ctx = get_ctx(request)
        folder = ctx.data.tiers.path(v.tier, v.key)
        examples, images, total = text.examples(folder, offset=(number - 1) * EXAMPLES, limit=EXAMPLES), [], v.samples
        language_models = [f"{m.name}@{mv.version}" for m, versions in models.list_models(session, viewer.principal)
                           for mv in versions if (mv.signature or {}).get("kind") == "causal-lm"]
        if tokenizer:
            _, mv = models.get_version(session, viewer.principal, tokenizer)
            token_counts = service.token_stats(session, viewer.principal, ctx.data, ref, mv, model_ref=tokenizer,
                                               models_root=ctx.settings.models_dir,
                                               cache_root=ctx.settings.hot_root / ".token-counts")
    else:
        examples = []
        images, total = _images(request, v).page((number - 1) * GALLERY, GALLERY, label or None)
    base = f"/datasets/{owner}/{ds.name}@{v.version}"
    return page(request, "dataset.html", ds=ds, v=v, owner=owner, stats=stats, images=images, total=total,
                text=is_text, examples=examples, language_models=language_models, tokenizer=tokenizer,
                token_counts=token_counts,
                label=label, page_no=number, pages=max(1, math.ceil(total / (EXAMPLES if is_text else GALLERY))),
                versions=service.versions(session, ds), base=base,
                link=lambda **kw: base + "?" + urlencode({k: v for k, v in {"label": label, "tokenizer": tokenizer,
                                                                             "page": number, **kw}.items() if v}),
                quarantined=(v.report or {}).get("quarantined", []),
                peak=max([1, *(stats.get("per_class") or {}).values()]),
                size_peak=max([1, *(stats.get("length_histogram" if is_text else "size_histogram") or {}).values()]))
