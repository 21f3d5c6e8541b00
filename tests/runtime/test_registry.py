"""Inside a job: API errors reach the user as their message, not raw JSON."""

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from deeppod.runtime import registry


@pytest.fixture
def refusing_server(monkeypatch):
    body = json.dumps({"error": {"code": "not_found", "message": "no model folder at /x: check the path"}}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("DEEPPOD_API_URL", f"http://127.0.0.1:{srv.server_address[1]}")
    monkeypatch.setenv("DEEPPOD_TOKEN", "dp_job")
    yield
    srv.shutdown()
    srv.server_close()


def test_register_model_shows_the_servers_message(refusing_server, tmp_path):
    with pytest.raises(RuntimeError) as info:
        registry.register_model("pets", tmp_path)
    assert str(info.value) == "the server answered 404: no model folder at /x: check the path (not_found)"


def test_error_message_falls_back_to_the_text():
    assert registry.error_message(b"<html>bad gateway</html>") == "<html>bad gateway</html>"
    assert registry.error_message(b'{"detail": "x"}') == '{"detail": "x"}'


def test_a_job_reaches_the_next_server_when_the_first_is_down(refusing_server, monkeypatch, tmp_path):
    """DEEPPOD_API_URL lists every server of a failover control plane: a refused connection
    moves on to the next one; an answer, even an error, is the answer."""
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    import os

    monkeypatch.setenv("DEEPPOD_API_URL", f"{dead},{os.environ['DEEPPOD_API_URL']}")
    with pytest.raises(RuntimeError, match="the server answered 404"):
        registry.register_model("pets", tmp_path)
    monkeypatch.setenv("DEEPPOD_API_URL", dead)
    with pytest.raises(RuntimeError, match="cannot reach the server"):
        registry.register_model("pets", tmp_path)
