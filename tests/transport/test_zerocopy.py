"""Zero-copy sends (transport/zerocopy.py) through a real uvicorn server, its protocol and event loop
chosen as for the DeepPod server: offered with the uvicorn installed, bodies intact whole and
in part, after bytes still buffered, from a pipe (read through Python), none for a HEAD,
connections kept alive after them; a reader that stops holds no worker thread; a reader that
leaves and a file that ends early cost the server nothing."""

import http.client
import logging
import os
import socket
import threading
from urllib.parse import parse_qs

import anyio
import pytest

from deeppod.transport import zerocopy
from deeppod.transport.zerocopy import EXTENSION
from tests.helpers import uvicorn_in_thread, wait_until


def _buffered_at_most() -> int:
    """What the sockets between a server and a reader that stops may hold: its send buffer's
    and the reader's receive buffer's largest sizes (2x for the kernel's bookkeeping)."""
    most = 0
    for name in ("tcp_wmem", "tcp_rmem"):
        try:
            most += int(open(f"/proc/sys/net/ipv4/{name}").read().split()[2])
        except (OSError, IndexError, ValueError):
            most += 64 * 2**20
    return 2 * most


SIZE = max(24 * 2**20, _buffered_at_most()) + 11  # a reader that stops stops the sending


async def _app(scope, receive, send):
    """/offered says whether the extension is; /file?offset=&count=&length=&before= sends a part
    of the file by it, declaring ``length`` (a length past the file's end makes a short body),
    its first ``before`` bytes as an ordinary body; /pipe?count= sends as much from a pipe, which
    sendfile cannot read; /threads?n=N sets the worker threads to N."""
    if scope["type"] != "http":
        return
    q = {k: int(v[0]) for k, v in parse_qs(scope["query_string"].decode()).items()}
    if scope["path"] == "/threads":
        anyio.to_thread.current_default_thread_limiter().total_tokens = q["n"]
        body = b"ok"
    elif scope["path"] == "/offered":
        body = b"yes" if EXTENSION in (scope.get("extensions") or {}) else b"no"
    elif scope["path"] == "/pipe":
        r, w = os.pipe()
        with open(scope["state"]["file"], "rb") as src, os.fdopen(r, "rb") as f, os.fdopen(w, "wb") as sink:
            writer = threading.Thread(target=lambda: (sink.write(src.read(q["count"])), sink.close()))
            writer.start()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", str(q["count"]).encode())]})
            await send({"type": EXTENSION, "file": f, "offset": 0, "count": q["count"]})
            writer.join()
        return
    else:
        offset, count, before = q.get("offset", 0), q.get("count", SIZE), q.get("before", 0)
        with open(scope["state"]["file"], "rb") as f:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", str(q.get("length", count + before)).encode())]})
            if before:
                await send({"type": "http.response.body", "body": f.read(before), "more_body": True})
            await send({"type": EXTENSION, "file": f, "offset": offset + before, "count": count})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def served(tmp_path):
    """(port, the file's bytes) of a uvicorn server in a thread, with the server's settings."""
    data = os.urandom(SIZE)
    path = tmp_path / "data.bin"
    path.write_bytes(data)

    async def app(scope, receive, send):
        scope.setdefault("state", {})["file"] = str(path)
        await _app(scope, receive, send)

    with uvicorn_in_thread(app) as port:
        yield port, data


def get(conn: http.client.HTTPConnection, path: str) -> bytes:
    conn.request("GET", path)
    r = conn.getresponse()
    assert r.status == 200
    return r.read()


def test_offered_by_the_uvicorn_installed_and_bodies_arrive_whole(served):
    port, data = served
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    assert get(conn, "/offered") == b"yes"  # uvicorn's request cycle still has what zerocopy uses
    assert get(conn, "/file") == data
    assert get(conn, "/file?offset=3&count=5000000") == data[3:5000003]
    assert get(conn, f"/file?offset={SIZE - 10}&count=10") == data[-10:]
    # bytes the transport still holds go first: the file's follow them
    assert get(conn, "/file?before=12000000&count=3000000") == data[:15000000]
    assert get(conn, "/pipe?count=9000000") == data[:9000000]  # read and written where sendfile cannot
    conn.request("HEAD", "/file")
    r = conn.getresponse()
    assert r.status == 200 and r.headers["content-length"] == str(SIZE) and r.read() == b""
    assert get(conn, "/offered") == b"yes"  # the same connection, kept alive after each


def test_a_reader_that_stops_holds_no_worker_thread(served):
    port, data = served
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    assert get(conn, "/threads?n=1") == b"ok"  # one worker thread for every copy
    stalled = socket.create_connection(("127.0.0.1", port))
    stalled.sendall(b"GET /file HTTP/1.1\r\nHost: x\r\n\r\n")
    first = stalled.recv(4096)
    assert first.startswith(b"HTTP/1.1 200")
    # while that reader reads nothing more, another copy gets the one thread
    assert get(conn, "/file?count=8000000") == data[:8000000]
    got = bytearray(first.split(b"\r\n\r\n", 1)[1])
    while len(got) < SIZE:
        piece = stalled.recv(2**20)
        assert piece, f"the stalled reader's body ended at {len(got)} of {SIZE} bytes"
        got += piece
    assert bytes(got) == data
    stalled.close()


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_reader_that_leaves_and_a_file_that_ends_early_cost_nothing(served, caplog):
    caplog.set_level(logging.WARNING, logger="uvicorn")
    port, data = served
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    assert get(conn, "/offered") == b"yes"
    before = _fds()
    for _ in range(3):
        gone = socket.create_connection(("127.0.0.1", port))
        gone.sendall(b"GET /file HTTP/1.1\r\nHost: x\r\n\r\n")
        assert gone.recv(4096).startswith(b"HTTP/1.1 200")
        gone.close()  # mid-body
    short = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    short.request("GET", f"/file?offset={SIZE - 100}&count=200&length=200")  # 100 bytes past the end
    r = short.getresponse()
    with pytest.raises(http.client.IncompleteRead):
        r.read()
    short.close()
    assert get(conn, "/file?count=1000") == data[:1000]  # the server goes on
    wait_until(lambda: _fds() <= before, timeout=30, what="the connections' descriptors closed")
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_not_offered_where_bytes_must_pass_through_python():
    async def send(message):
        pass

    http_scope = {"type": "http", "scheme": "http"}
    assert zerocopy.offered(http_scope, send) is None  # not uvicorn's request cycle (a test client, another server)
    assert zerocopy.offered({"type": "http", "scheme": "https"}, send) is None  # TLS encrypts in Python
    assert zerocopy.offered({"type": "lifespan"}, send) is None


def test_without_the_extension_a_file_is_read_and_sent_through_python(tmp_path):
    """What the S3 endpoint does over TLS or under a test client: the same bytes, in blocks."""
    path = tmp_path / "f.bin"
    data = os.urandom(zerocopy.BLOCK * 2 + 5)
    path.write_bytes(data)
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    async def main():
        with open(path, "rb") as f:
            await zerocopy.send_file(send, f, 3, len(data) - 3, zero_copy=False)
            assert sent[-1]["more_body"] is False
            assert b"".join(m["body"] for m in sent) == data[3:]
            assert await zerocopy.read_out(send, f, len(data) - 2, 10) is False  # the file ends first

    anyio.run(main)
