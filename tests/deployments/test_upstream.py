"""The router's client to replicas: kept-alive connections, a replica that closed an idle
connection, chunked answers, and a replica that is gone."""

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from deeppod.deployments.upstream import Upstream
from deeppod.errors import UpstreamError


@pytest.fixture
def replica():
    seen = {"connections": 0, "bodies": []}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self):
            seen["connections"] += 1
            super().setup()

        def do_POST(self):
            body = self.rfile.read(int(self.headers["content-length"]))
            seen["bodies"].append((self.path, self.headers["content-type"], body))
            if self.path.startswith("/chunked"):
                self.send_response(200)
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for part in (b"hel", b"lo"):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                self.wfile.write(b"0\r\n\r\n")
                return
            answer = b'{"ok": true, "n": %d}' % len(body)
            self.send_response(200 if self.path.startswith("/predict") else 422)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(answer)))
            if self.path.endswith("close=1"):
                self.send_header("connection", "close")
            self.end_headers()
            self.wfile.write(answer)
            if self.path.endswith("drop=1"):  # as an idle timeout does: closed without a word
                self.close_connection = True

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen, server
    server.shutdown()


def test_requests_share_one_kept_alive_connection_and_answers_come_back_whole(replica):
    url, seen, _ = replica

    async def go():
        up = Upstream()
        replies = [await up.post(url, "/predict?top_k=2", b"x" * n, "image/jpeg") for n in (10, 100_000, 3)]
        bad = await up.post(url, "/other", b"{}", "application/json")
        chunked = await up.post(url, "/chunked", b"", "application/json")
        up.close()
        return replies, bad, chunked

    replies, bad, chunked = asyncio.run(go())
    assert [r.status for r in replies] == [200, 200, 200]
    assert [r.body for r in replies] == [b'{"ok": true, "n": 10}', b'{"ok": true, "n": 100000}',
                                         b'{"ok": true, "n": 3}']
    assert replies[0].headers["content-type"] == "application/json"
    assert bad.status == 422 and chunked.body == b"hello"
    assert seen["connections"] == 1
    assert seen["bodies"][0] == ("/predict?top_k=2", "image/jpeg", b"x" * 10)


def test_a_connection_the_replica_closed_is_replaced(replica):
    url, seen, _ = replica

    async def go():
        up = Upstream()
        first = await up.post(url, "/predict?close=1", b"a", "image/png")  # the replica says close
        second = await up.post(url, "/predict?drop=1", b"b", "image/png")  # it closes without saying
        await asyncio.sleep(0.1)
        third = await up.post(url, "/predict", b"c", "image/png")  # the pooled one fails: sent again
        return first, second, third

    answers = asyncio.run(go())
    assert [a.status for a in answers] == [200, 200, 200] and seen["connections"] == 3
    assert [b for _, _, b in seen["bodies"]] == [b"a", b"b", b"c"]


def test_a_replica_that_is_gone_raises_upstream_error():
    async def go():
        await Upstream(connect_timeout=1.0).post("http://127.0.0.1:1", "/predict", b"x", "image/png")

    with pytest.raises(UpstreamError, match="cannot connect"):
        asyncio.run(go())
    with pytest.raises(UpstreamError, match="http://host:port"):
        asyncio.run(Upstream().post("https://example.invalid", "/predict", b"", "x"))
