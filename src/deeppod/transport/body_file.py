"""A request's body into a file, none of it written on the event loop: a large body with a
Content-Length is read from the socket and written by worker threads (transport/direct_body.py,
where the server offers it); any other is gathered on the loop a block at a time and each
block written by a worker thread. The API's dataset upload used to write every 64 KiB piece
on the loop, so a slow disk stalled every other request the server was answering."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
from starlette.requests import ClientDisconnect

from deeppod.errors import ClientGone
from deeppod.transport import direct_body

BLOCK = 1 << 20  # what the loop gathers before a worker thread writes it
DIRECT_MIN = 4 << 20  # a larger body is read off the loop where offered (its connection closes after)


def content_length(scope) -> int | None:
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


async def to_file(scope, chunks: AsyncIterator[bytes], path: Path, limit: int,
                  too_large: Callable[[], Exception]) -> int:
    """The body into ``path`` (created or truncated); its size. ``chunks``: the body as the app
    gets it (Starlette's ``request.stream()``, which also gives a body a dependency read
    already), used where it is not read off the loop; ``too_large()`` is raised as soon as the
    body is known to be over ``limit`` bytes (at once from its Content-Length); ClientGone if
    the client leaves first. The caller removes the file on failure."""
    length = content_length(scope)
    if length is not None and length > limit:
        raise too_large()
    size = 0
    out = await anyio.to_thread.run_sync(open, path, "wb")
    try:
        direct = (scope.get("extensions") or {}).get(direct_body.EXTENSION)
        if direct is not None and length is not None and length >= DIRECT_MIN:
            def sink(piece: memoryview) -> None:  # in a worker thread
                nonlocal size
                size += len(piece)
                if size > limit:
                    raise too_large()
                out.write(piece)

            await direct["read"](sink)
            return size
        pending: list[bytes] = []
        waiting = 0
        try:
            async for data in chunks:
                size += len(data)
                if size > limit:
                    raise too_large()
                pending.append(data)
                waiting += len(data)
                if waiting >= BLOCK:
                    await anyio.to_thread.run_sync(out.writelines, pending)
                    pending, waiting = [], 0
        except ClientDisconnect:
            raise ClientGone() from None
        if pending:
            await anyio.to_thread.run_sync(out.writelines, pending)
        return size
    finally:
        out.close()
