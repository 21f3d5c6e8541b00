"""The replica's side of direct tokens: what it opens, what it refuses, what it reports."""

import pytest

from deeppod.serve import direct
from deeppod.serve.direct import DirectAccess, open_token, sign

KEY = b"k" * 32


class Clocks:
    def __init__(self):
        self.wall, self.mono = 1_000_000.0, 50.0


@pytest.fixture
def access():
    c = Clocks()
    a = DirectAccess(KEY, 7, clock=lambda: c.wall, monotonic=lambda: c.mono)
    a.apply({"revoked": []})
    return a, c


def token(**claims):
    return "Bearer " + sign(KEY, {"d": 7, "j": "t1", "e": 1_000_600, "t": "a", "u": "alice", **claims})


def test_a_token_signed_with_the_key_opens_and_nothing_else_does():
    t = sign(KEY, {"d": 7, "j": "t1", "e": 5})
    assert open_token(KEY, t) == {"d": 7, "j": "t1", "e": 5}
    body, _, sig = t.rpartition(".")
    forged = sign(b"other" * 8, {"d": 7, "j": "t1", "e": 5})
    tampered = direct.DIRECT_TOKEN_PREFIX + direct._b64(b'{"d":8,"e":5,"j":"t1"}') + "." + sig
    for bad in (forged, tampered, t[:-2], "dpd1.x.y", "dpd1.", "", "Bearer", t + ".x", body + ".", "dpk_abc"):
        assert open_token(KEY, bad) is None, bad
    assert open_token(KEY, sign(KEY, {"d": 7, "j": "t1"})) is None  # no expiry: not a token of ours


def test_check_opens_a_good_token_and_refuses_the_rest_with_the_reason(access):
    a, c = access
    claims, refusal = a.check(token())
    assert refusal is None and claims["j"] == "t1"
    assert a.check(token(d=8))[1].code == "unauthenticated"  # another deployment's
    assert a.check("Bearer " + sign(b"x" * 32, {"d": 7, "j": "t1", "e": 1_000_600}))[1].status == 401
    assert a.check("")[1].status == 401
    assert a.check(token(e=1_000_000))[1].code == "token_expired"
    a.apply({"revoked": ["t1"]})
    assert a.check(token())[1].code == "token_revoked"
    assert a.check(token(j="t2"))[1] is None


def test_a_replica_out_of_touch_with_its_control_plane_pauses_direct_tokens(access):
    a, c = access
    c.mono += direct.STALE_SECONDS + 0.1
    refusal = a.check(token())[1]
    assert refusal.status == 503 and "predict on the server" in refusal.message
    a.apply({"revoked": []})
    assert a.check(token())[1] is None
    fresh = DirectAccess(KEY, 7)  # never synced: nothing it could know is revoked is let in
    assert fresh.check(token(e=2**40))[1].code == "direct_paused"


def test_use_and_refusals_are_reported_once_and_given_back_when_the_report_fails(access):
    a, c = access
    a.used("t1", 200, 0.01)
    a.used("t1", 200, 0.02)
    a.used("t1", 422, 0.005)
    a.check(token(e=1))  # expired: refused, and listed with who it was
    sent = []

    def down(report):
        sent.append(report)
        raise OSError("connection refused")

    assert not a.sync_once(down)
    a.used("t1", 200, 0.01)
    answers = []
    assert a.sync_once(lambda report: answers.append(report) or {"revoked": ["t9"]})
    report = answers[0]
    assert report["usage"] == [{"jti": "t1", "codes": {"200": 3, "422": 1}, "seconds": pytest.approx(0.045)}]
    assert report["refused_count"] == 1 and report["refused"][0]["code"] == "token_expired"
    assert report["refused"][0]["user"] == "alice"
    assert a.revoked == {"t9"}
    assert a.take_report() == {"usage": [], "refused": [], "refused_count": 0}


def test_a_flood_of_bad_tokens_is_counted_not_listed(access):
    a, _ = access
    for _ in range(direct.MAX_REFUSALS_KEPT + 50):
        a.check("Bearer junk")
    report = a.take_report()
    assert report["refused_count"] == direct.MAX_REFUSALS_KEPT + 50
    assert len(report["refused"]) == direct.MAX_REFUSALS_KEPT


def test_it_syncs_often_while_tokens_come_and_less_when_none_do(access):
    a, c = access
    assert a.interval() == direct.IDLE_SYNC_SECONDS
    a.check(token())
    assert a.interval() == direct.SYNC_SECONDS
    c.mono += direct.BUSY_SECONDS + 1
    assert a.interval() == direct.IDLE_SYNC_SECONDS


def test_the_control_plane_client_keeps_one_connection_and_moves_to_the_server_that_answers():
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from deeppod.contract import free_port

    seen = {"connections": set(), "bodies": []}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):  # noqa: N802
            seen["connections"].add(self.client_address)
            seen["bodies"].append((self.path, self.headers["Authorization"],
                                   json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
            status, out = (200, b'{"revoked": ["x"]}') if "bad" not in self.path else (403, b'{"error": {}}')
            self.send_response(status)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *a):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        down = f"http://127.0.0.1:{free_port()}"  # the failover pair's other server, not listening
        plane = direct.ControlPlane(f"{down},http://127.0.0.1:{httpd.server_port}", "tok", "12")
        assert plane.post({"usage": []}) == {"revoked": ["x"]}
        assert plane.post({"usage": [1]}) == {"revoked": ["x"]}
        assert len(seen["connections"]) == 1  # kept alive
        assert seen["bodies"][0] == ("/v1/replicas/12/direct", "Bearer tok", {"usage": []})
        with pytest.raises(RuntimeError, match="answered 403"):
            direct.ControlPlane(f"http://127.0.0.1:{httpd.server_port}", "tok", "bad").post({})
        with pytest.raises(RuntimeError, match="no server answered"):
            direct.ControlPlane(down, "tok", "12").post({})
    finally:
        httpd.shutdown()
