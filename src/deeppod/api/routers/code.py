"""A job's code, sent before the job: PUT /v1/code/DIGEST with a tar.gz body."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.concurrency import run_in_threadpool

from deeppod.api.deps import PrincipalDep, get_ctx
from deeppod.api.schemas.code import CodeOut
from deeppod.errors import InvalidRequest, TooLarge

router = APIRouter(prefix="/v1/code", tags=["jobs"])
Digest = Annotated[str, Path(pattern="^[0-9a-f]{64}$", description="SHA-256 of the archive, lowercase hex")]
BODY = {"requestBody": {"required": True, "content": {
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}  # a tar.gz


def is_upload(method: str | None, path: str) -> bool:
    return method == "PUT" and path.startswith("/v1/code/")


@router.put("/{digest}", response_model=CodeOut, openapi_extra=BODY)
async def put(digest: Digest, request: Request, principal: PrincipalDep) -> CodeOut:
    """Keep a tar.gz of a job's folder for your tenant; submit jobs with ``code: DIGEST``.
    Idempotent: the same archive again changes nothing."""
    store = get_ctx(request).code
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > store.max_bytes:
            raise TooLarge(f"the code archive is over {store.max_bytes >> 20} MiB (DEEPPOD_CODE_MAX_BYTES): leave "
                           "data and outputs out of the folder (put data in a dataset)")
    if not data:
        raise InvalidRequest("the body is empty: send the folder as a tar.gz archive")
    info = await run_in_threadpool(store.put, principal.tenant_id, digest, data)
    return CodeOut(digest=info.digest, bytes=info.bytes, files=info.files)
