"""A dataset's next version from an archive streamed in a request's body: spooled to disk under
the per-ingest limit (none of it written on the event loop), then built all or nothing. The
API's ingest and the console's upload both come through here."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from deeppod.datasets import service
from deeppod.errors import InvalidRequest, TooLarge
from deeppod.transport import body_file


async def ingest_request(request: Request, sessions, plane, principal, name: str, **kw) -> int:
    """The new version's id."""
    spool = plane.spool()
    limit = plane.limits.max_ingest_bytes
    try:
        size = await body_file.to_file(request.scope, request.stream(), spool, limit, lambda: TooLarge(
            f"the upload is over the per-ingest limit of {limit} bytes (DEEPPOD_DATA_MAX_INGEST_BYTES): split the "
            "dataset"))
        if size == 0:
            raise InvalidRequest("the upload is empty: send a tar, tar.gz or zip archive as the request body")
        return await run_in_threadpool(service.ingest_upload, sessions, plane, principal, name, spool, **kw)
    finally:
        spool.unlink(missing_ok=True)
