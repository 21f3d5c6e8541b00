"""Large request bodies read straight from the socket in worker threads, not through the event
loop: uvicorn parses every body byte on the loop and hands it over in pieces of at most 64 KiB
(a 64 MiB upload kept the loop thread busy for 0.57 of a core at 300 MB/s), while here a worker
thread reads a block at a time into one buffer and gives it to the app's ``sink`` (which
hashes and writes it in the same thread).

Offered by :class:`deeppod.transport.zerocopy.ZeroCopySend` where the connection is uvicorn's
httptools protocol over plain TCP and the request has a Content-Length, as the scope extension
``deeppod.http.request.direct``: ``await scope["extensions"][EXTENSION]["read"](sink)``, called
before any ``receive()``. Reading the rest of the body past uvicorn's parser leaves the parser
mid-body, so the connection closes after the response (the client opens another: nothing
against a body this large). A body that had all arrived already keeps the connection.

Like the zero-copy send, a thread waits at most ``cycle_socket.HOLD_S`` for bytes before it
hands back; a slow sender is waited for on the event loop, so it holds no thread. A client that
leaves raises :class:`ClientGone`.
"""

from __future__ import annotations

import os
import select

import anyio

from deeppod.errors import ClientGone
from deeppod.transport import cycle_socket

EXTENSION = "deeppod.http.request.direct"
BLOCK = 1 << 20  # what the sink is given at a time (the last piece may be shorter)
_CYCLE_STATE = ("body", "more_body", "keep_alive", "waiting_for_100_continue", "transport", "flow", "disconnected")


def extension(cycle, scope) -> dict | None:
    """The extension's entry for a request on ``cycle`` (uvicorn's, checked by the caller), or
    None where it cannot be offered (no Content-Length, a chunked body, a cycle without the
    state this reads)."""
    if not all(hasattr(cycle, a) for a in _CYCLE_STATE):
        return None
    length = None
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            length = value
        elif name == b"transfer-encoding":
            return None
    if length is None or not length.isdigit():
        return None

    async def read(sink) -> int:
        return await _read(cycle, int(length), sink)

    return {"read": read}


async def _read(cycle, length: int, sink) -> int:
    """The whole body, given to ``sink`` (called in worker threads, in order, with memoryviews
    valid only during the call); the number of bytes."""
    if cycle.disconnected:
        raise ClientGone()
    if cycle.waiting_for_100_continue and not cycle.transport.is_closing():
        cycle.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # what uvicorn's receive() sends
        cycle.waiting_for_100_continue = False
    first, cycle.body = bytes(cycle.body), bytearray()  # parsed already: given to the sink first
    if not cycle.more_body:  # all of it came with the headers: the parser is past it, keep-alive stays
        if first:
            await anyio.to_thread.run_sync(sink, memoryview(first))
        return len(first)
    cycle.flow.pause_reading()  # from here on the socket is read here, not by the loop
    cycle.keep_alive = False  # the parser never sees the rest of this body
    left = length - len(first)
    fd = cycle_socket.dup(cycle)
    buf = memoryview(bytearray(BLOCK))
    try:
        while left > 0:
            n, ended = await anyio.to_thread.run_sync(_recv_some, fd, buf, sink, left, first)
            first = b""
            left -= n
            if ended:
                raise ConnectionResetError("the client closed the connection mid-body")
            if n == 0 and left > 0:  # the sender is slow: wait on the loop, no thread held
                await cycle_socket.ready(fd, write=False)
    except (ConnectionResetError, BrokenPipeError):
        cycle_socket.hang_up(cycle)
        raise ClientGone() from None
    finally:
        os.close(fd)
    return length


def _recv_some(fd: int, buf: memoryview, sink, left: int, first: bytes) -> tuple[int, bool]:
    """(bytes received and given to ``sink``, whether the client closed): ``first`` given first,
    then up to ``left`` bytes read a block at a time, until they are in or nothing has come for
    ``cycle_socket.HOLD_S``."""
    if first:
        sink(memoryview(first))
    got = filled = 0
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    ended = False
    while got + filled < left:
        try:
            n = os.readv(fd, [buf[filled:min(len(buf), filled + left - got)]])
        except BlockingIOError:
            if filled:  # what came is given before the wait
                sink(buf[:filled])
                got, filled = got + filled, 0
            if not poller.poll(cycle_socket.HOLD_S * 1000):
                break
            continue
        if n == 0:
            ended = True
            break
        filled += n
        if filled == len(buf):
            sink(buf)
            got, filled = got + filled, 0
    if filled:
        sink(buf[:filled])
        got += filled
    return got, ended

