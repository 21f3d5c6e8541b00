"""A request's body into a file (transport/body_file.py) through a real uvicorn server with the
server's protocol and wrapper: a large body read off the loop and a small one gathered on it
arrive whole; a body over the limit is refused at once by its Content-Length, and a chunked
one as soon as it passes the limit; a client that leaves raises ClientGone."""

import hashlib
import http.client
import socket

import pytest
from starlette.requests import ClientDisconnect

from deeppod.errors import ClientGone, TooLarge
from deeppod.transport.body_file import DIRECT_MIN, to_file
from deeppod.transport.direct_body import EXTENSION
from tests.helpers import uvicorn_in_thread, wait_until

LIMIT = 3 * DIRECT_MIN


@pytest.fixture
def served(tmp_path):
    seen: list = []

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        path = tmp_path / f"body-{len(seen)}"
        direct = EXTENSION in (scope.get("extensions") or {})
        async def chunks():  # what Starlette's request.stream() gives
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientDisconnect()
                yield message.get("body", b"")
                if not message.get("more_body"):
                    return

        try:
            size = await to_file(scope, chunks(), path, LIMIT, lambda: TooLarge("over the limit"))
        except TooLarge:
            seen.append(("too large", path.stat().st_size if path.exists() else None))
            status, body = 413, b"too large"
        except ClientGone:
            seen.append(("gone", None))
            return
        else:
            seen.append(("ok", size))
            digest = hashlib.md5(path.read_bytes()).hexdigest()
            status, body = 200, f"{'direct' if direct else 'plain'} {size} {digest}".encode()
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-length",
                                                                                  b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    with uvicorn_in_thread(app) as port:
        yield port, seen


def _post(port, body, **kw):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        c.request("POST", "/", body=body, **kw)
        r = c.getresponse()
        return r.status, r.read().decode(), r.getheader("connection")
    finally:
        c.close()


@pytest.mark.parametrize("size", [DIRECT_MIN + 2**20 + 5, 100_000, 0])
def test_a_body_arrives_whole(served, size):
    port, seen = served
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    status, answer, connection = _post(port, data)
    assert status == 200, answer
    how, got, md5 = answer.split()
    assert (int(got), md5) == (size, hashlib.md5(data).hexdigest())
    # read past uvicorn's parser (off the loop) only when large: that connection closes after
    assert how == "direct" and (connection == "close") == (size >= DIRECT_MIN), connection
    assert seen == [("ok", size)]


def test_a_body_over_the_limit_is_refused_by_its_length_before_any_byte_is_read(served):
    port, seen = served
    with socket.create_connection(("127.0.0.1", port)) as s:  # the headers only: the server answers at once
        s.sendall(f"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: {LIMIT + 1}\r\n\r\n".encode())
        s.settimeout(30)
        assert s.recv(65536).startswith(b"HTTP/1.1 413")
    assert seen == [("too large", None)]  # no file was even made


def test_a_chunked_body_is_refused_once_it_passes_the_limit(served):
    port, seen = served
    sent = []

    def pieces():
        for _ in range(LIMIT // 2**20 + 8):
            sent.append(1)
            yield b"y" * 2**20

    status, _, _ = _post(port, pieces(), encode_chunked=True, headers={"Transfer-Encoding": "chunked"})
    assert status == 413
    (what, written), = seen
    assert what == "too large" and written <= LIMIT


def test_a_client_that_leaves_mid_body_is_gone(served):
    port, seen = served
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(f"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: {2 * DIRECT_MIN}\r\n\r\n".encode() + b"z" * 2**20)
    wait_until(lambda: seen == [("gone", None)], 30, what="the server to see the client leave")
