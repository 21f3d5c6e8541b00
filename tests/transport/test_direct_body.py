"""Request bodies read off the event loop (transport/direct_body.py) through a real uvicorn server, its
protocol and event loop chosen as for the DeepPod server: offered with the uvicorn installed for
an upload with a Content-Length (not a chunked one), bodies intact, after ``Expect:
100-continue`` too; the connection closes after a body read that way and stays open after one
that had all arrived; a sender that stalls holds no worker thread; one that leaves costs the
server nothing."""

import hashlib
import logging
import os
import socket
import struct

import anyio
import pytest

from deeppod.errors import ClientGone
from deeppod.transport.direct_body import EXTENSION
from tests.helpers import uvicorn_in_thread, wait_until

SIZE = 24 * 2**20 + 7


@pytest.fixture
def served():
    """(port, what the app saw) of a uvicorn server in a thread, with the server's settings. PUT
    /?threads=N sets the worker threads to N first; the answer is "direct|plain MD5 SIZE"."""
    seen: list = []

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        if scope["query_string"].startswith(b"threads="):
            anyio.to_thread.current_default_thread_limiter().total_tokens = int(scope["query_string"][8:])
        md5, count = hashlib.md5(), 0

        def sink(piece):
            nonlocal count
            md5.update(piece)
            count += len(piece)

        direct = (scope.get("extensions") or {}).get(EXTENSION)
        seen.append("reading")
        try:
            if direct is not None:
                assert await direct["read"](sink) == count
            else:
                while True:
                    message = await receive()
                    sink(message.get("body", b""))
                    if not message.get("more_body"):
                        break
        except ClientGone:
            seen.append("gone")
            return
        body = f"{'direct' if direct else 'plain'} {md5.hexdigest()} {count}".encode()
        seen.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    with uvicorn_in_thread(app) as port:
        yield port, seen


def _head(length: int | None, path: str = "/", extra: str = "") -> bytes:
    size = f"content-length: {length}\r\n" if length is not None else "transfer-encoding: chunked\r\n"
    return f"PUT {path} HTTP/1.1\r\nhost: x\r\n{size}{extra}\r\n".encode()


def _answer(sock: socket.socket) -> tuple[dict, bytes]:
    """The response's headers and body (by its Content-Length)."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        piece = sock.recv(65536)
        assert piece, f"the server closed before answering: {raw!r}"
        raw += piece
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0].startswith("HTTP/1.1 200"), lines[0]
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    return headers, body


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_offered_with_the_uvicorn_installed_and_bodies_arrive_whole(served):
    port, _ = served
    data = os.urandom(SIZE)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(_head(SIZE) + data)
        headers, body = _answer(s)
        assert body == f"direct {hashlib.md5(data).hexdigest()} {SIZE}".encode()
        assert headers["connection"] == "close" and _closed(s)  # the parser never saw the rest: no reuse
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:  # one that came with its headers keeps it
        s.sendall(_head(5) + b"hello")
        headers, body = _answer(s)
        assert body == f"direct {hashlib.md5(b'hello').hexdigest()} 5".encode() and "connection" not in headers
        s.sendall(_head(2) + b"hi")
        assert _answer(s)[1] == f"direct {hashlib.md5(b'hi').hexdigest()} 2".encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:  # chunked: not offered, read as before
        s.sendall(_head(None) + b"5\r\nhello\r\n0\r\n\r\n")
        assert _answer(s)[1] == f"plain {hashlib.md5(b'hello').hexdigest()} 5".encode()


def test_a_client_that_waits_for_100_continue_gets_it_and_sends(served):
    port, _ = served
    data = os.urandom(9 * 2**20)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(_head(len(data), extra="expect: 100-continue\r\n"))
        s.settimeout(10)
        assert s.recv(25) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(data)
        assert _answer(s)[1] == f"direct {hashlib.md5(data).hexdigest()} {len(data)}".encode()


def test_a_sender_that_stalls_holds_no_worker_thread(served):
    port, _ = served
    data = os.urandom(SIZE)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as slow:
        slow.sendall(_head(SIZE, "/?threads=1") + data[:SIZE // 2])  # one worker thread, then a stall
        other = os.urandom(9 * 2**20)
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:  # goes through meanwhile
            s.sendall(_head(len(other)) + other)
            assert _answer(s)[1] == f"direct {hashlib.md5(other).hexdigest()} {len(other)}".encode()
        slow.sendall(data[SIZE // 2:])
        assert _answer(slow)[1] == f"direct {hashlib.md5(data).hexdigest()} {SIZE}".encode()


def test_a_sender_that_leaves_mid_body_costs_nothing(served, caplog):
    port, seen = served
    caplog.set_level(logging.WARNING)
    fds = len(os.listdir("/proc/self/fd"))
    for n in range(1, 4):
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            s.sendall(_head(SIZE) + os.urandom(3 * 2**20))
            wait_until(lambda: seen.count("reading") == n, timeout=30, what="the app to be reading the body")
            if n == 3:  # the last one resets the connection; the others close it
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    wait_until(lambda: seen.count("gone") == 3, timeout=30, what="the server to see each client leave")
    wait_until(lambda: len(os.listdir("/proc/self/fd")) <= fds, timeout=30, what="no descriptor left open")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
