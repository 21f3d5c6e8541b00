"""Zero-copy sends: a response body straight from an open file to the socket (``os.sendfile``),
never through Python's memory. It is ASGI's "zero-copy send" extension
(``http.response.zerocopysend``: ``file``, ``offset``, ``count``, ``more_body``), offered by
:class:`ZeroCopySend`, the server's outermost middleware, where the connection is uvicorn's
httptools protocol over plain TCP. Where it is not offered (TLS, the h11 protocol, another
server, a test client) apps send bytes as before; ``send_file`` does either, as the scope allows.

uvicorn does not implement the extension (uvicorn#35; a pathsend draft, #2840), so this uses
its request cycle's own state: the transport, its flow control, the bytes left of the
Content-Length. ``offered`` checks each of them on every request and offers nothing when one is
missing, and tests/api/test_zerocopy.py fails when the installed uvicorn stops giving them.

The copy runs in worker threads, each holding on to the socket for at most
``cycle_socket.HOLD_S`` while it waits for room; a slow reader is waited for on the event loop,
so it holds no thread.
"""

from __future__ import annotations

import errno
import os
import select

import anyio

from deeppod.transport import cycle_socket, direct_body

EXTENSION = "http.response.zerocopysend"
BLOCK = 4 << 20  # what is read at a time where the file's filesystem cannot sendfile
_CANNOT = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ESPIPE}  # sendfile: "not from this file"
_CYCLE_MODULE = "uvicorn.protocols.http.httptools_impl"
_CYCLE_STATE = ("scope", "transport", "flow", "expected_content_length", "chunked_encoding", "disconnected",
                "response_started", "response_complete", "send")


class ZeroCopySend:
    """ASGI middleware: offers ``http.response.zerocopysend`` where the connection allows it, and
    for an upload with a Content-Length, reading its body off the loop (transport/direct_body.py).
    An app that reads a body that way skips what middleware between does to ``receive``: it
    must enforce its own limits (the S3 endpoint does)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        cycle = offered(scope, send)
        if cycle is None:
            return await self.app(scope, receive, send)
        offers = {EXTENSION: {}}
        if scope.get("method") in ("PUT", "POST"):  # a large upload may be read off the loop
            direct = direct_body.extension(cycle, scope)
            if direct is not None:
                offers[direct_body.EXTENSION] = direct
        scope["extensions"] = {**(scope.get("extensions") or {}), **offers}

        async def send_or_sendfile(message):
            if message["type"] == EXTENSION:
                return await _sendfile(cycle, message)
            await send(message)

        await self.app(scope, receive, send_or_sendfile)


def offered(scope, send):
    """uvicorn's request cycle behind ``send`` when a file can go to its socket as it is, else None."""
    if scope["type"] != "http" or scope.get("scheme") != "http" or not hasattr(os, "sendfile"):
        return None
    cycle = getattr(send, "__self__", None)
    if type(cycle).__module__ != _CYCLE_MODULE or not all(hasattr(cycle, a) for a in _CYCLE_STATE):
        return None
    transport = cycle.transport
    if transport.get_extra_info("sslcontext") is not None or transport.get_extra_info("socket") is None:
        return None
    return cycle


async def _sendfile(cycle, message: dict) -> None:
    f = message["file"]
    offset = message.get("offset")
    offset = f.tell() if offset is None else offset
    count = message.get("count")
    count = max(0, os.fstat(f.fileno()).st_size - offset) if count is None else count
    more = message.get("more_body", False)
    if not cycle.response_started or cycle.response_complete or cycle.chunked_encoding is not False:
        raise RuntimeError(f"{EXTENSION} needs a started response with a Content-Length")
    if count > cycle.expected_content_length:
        raise RuntimeError("Response content longer than Content-Length")
    if cycle.disconnected:
        return
    if cycle.scope["method"] == "HEAD":  # the headers say what a GET would send; no body goes
        return await cycle.send({"type": "http.response.body", "body": b"", "more_body": more})
    await _drained(cycle)
    fd = cycle_socket.dup(cycle)
    try:
        sent = await _pump(fd, f.fileno(), offset, count)
    except (BrokenPipeError, ConnectionResetError):  # the client went: what it got is all it gets
        cycle_socket.hang_up(cycle)
        return
    except OSError as exc:
        if exc.errno not in _CANNOT:
            raise
        sent = None  # nothing sent: a file sendfile cannot read (a pipe; some FUSE filesystems)
    finally:
        os.close(fd)
    if sent is None:  # read and sent through Python instead
        whole = await read_out(cycle.send, f, offset, count, more)
    else:
        cycle.expected_content_length -= sent
        whole = sent == count
        if whole:
            await cycle.send({"type": "http.response.body", "body": b"", "more_body": more})
    if not whole:  # the file ended early (truncated under us): a short body the client sees as one
        cycle_socket.hang_up(cycle)


async def send_file(send, f, offset: int, count: int, *, zero_copy: bool) -> None:
    """``count`` bytes of ``f`` from ``offset`` as the rest of a response's body: by the
    extension where the scope offers it (``zero_copy``), else read and sent through Python. A
    file that ends early ends the body short (the client sees it so)."""
    if zero_copy:
        return await send({"type": EXTENSION, "file": f, "offset": offset, "count": count})
    await read_out(send, f, offset, count)


async def read_out(send, f, offset: int, count: int, more_body: bool = False) -> bool:
    """``count`` bytes of ``f`` from ``offset``, read in worker threads a block at a time and
    sent as body messages; False if the file ended first."""
    def read(n: int) -> bytes:
        return os.pread(f.fileno(), n, offset + done) if seekable else f.read(n)

    seekable, done = f.seekable(), 0
    while done < count:
        block = await anyio.to_thread.run_sync(read, min(BLOCK, count - done))
        if not block:
            return False
        done += len(block)
        await send({"type": "http.response.body", "body": block, "more_body": done < count or more_body})
    return True


async def _drained(cycle) -> None:
    """Until what uvicorn wrote (the status line and headers) has all gone to the socket: the
    file's bytes go after them, past the transport's buffer."""
    transport = cycle.transport
    if not transport.get_write_buffer_size():
        return
    high, low = transport.get_write_buffer_limits()[::-1]
    transport.set_write_buffer_limits(high=0, low=0)  # paused until empty, then resumed
    try:
        await cycle.flow.drain()
    finally:
        transport.set_write_buffer_limits(high=high, low=low)


async def _pump(fd: int, file_fd: int, offset: int, count: int) -> int:
    """Bytes sent of ``count`` from ``offset`` (fewer only if the file ended first)."""
    sent = 0
    while sent < count:
        try:
            n, ended = await anyio.to_thread.run_sync(_send_some, fd, file_fd, offset + sent, count - sent)
        except OSError as exc:
            if sent and exc.errno in _CANNOT:  # part of it gone already: no falling back to a copy
                raise RuntimeError(f"sendfile stopped after {sent} of {count} bytes: {exc}") from exc
            raise
        sent += n
        if ended:
            break
        if n == 0:  # the reader is slow: wait on the loop, no thread held
            await cycle_socket.ready(fd, write=True)
    return sent


def _send_some(fd: int, file_fd: int, offset: int, count: int) -> tuple[int, bool]:
    """(bytes sent, whether the file ended) until ``count`` is sent, the file ends, or the socket
    has had no room for ``cycle_socket.HOLD_S``."""
    sent = 0
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    while sent < count:
        try:
            n = os.sendfile(fd, file_fd, offset + sent, count - sent)
        except BlockingIOError:
            if not poller.poll(cycle_socket.HOLD_S * 1000):
                return sent, False
            continue
        except OSError:
            if sent:
                return sent, False  # counted; the next call raises it again
            raise
        if n == 0:
            return sent, True
        sent += n
    return sent, False
