"""/v1/notebooks and the proxy at /notebooks/ID/, against a stand-in for Jupyter on the
notebook's socket that says what it was sent: the notebook's own token goes in, the caller's
token and the console's cookie do not; the body and the answer pass through; who may not
reach it is told 401 or 404, and a notebook that does not run yet says why."""

import http.server
import json
import os
import socketserver
import threading

import pytest

from deeppod.auth.roles import ALL
from deeppod.auth.service import issue_job_token
from deeppod.auth.tokens import notebook_secret
from deeppod.contract import JobState
from deeppod.notebooks.upstream import SOCKET_NAME
from deeppod.store.models import Job
from tests.ui.conftest import Browser


class _Echo(http.server.BaseHTTPRequestHandler):
    def _answer(self):
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        out = json.dumps({"method": self.command, "path": self.path, "body": body.decode(),
                          "headers": {k.lower(): v for k, v in self.headers.items()}}).encode()
        self.send_response(201 if self.command == "POST" else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = _answer

    def log_message(self, *args):
        pass


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self):
        conn, _ = self.socket.accept()
        return conn, ("local", 0)


@pytest.fixture
def running_notebook(api):
    alice = api.user("alice", "lab")
    r = api.http.post("/v1/notebooks", json={"gpus_per_worker": 1, "idle_seconds": 1800}, headers=api.as_(alice))
    assert r.status_code == 201, r.text
    nb = r.json()
    with api.ctx.sessions.begin() as s:
        job = s.get(Job, nb["id"])
        job.state, workdir = JobState.RUNNING, job.workdir  # as the executor would have made it
    os.makedirs(workdir, exist_ok=True)
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        server = _UnixServer(SOCKET_NAME, _Echo)
    finally:
        os.chdir(cwd)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield nb, alice
    server.shutdown()
    server.server_close()


def test_a_started_notebook_is_listed_with_where_to_open_it(api):
    alice = api.user("alice", "lab")
    r = api.http.post("/v1/notebooks", json={"name": "explore"}, headers=api.as_(alice))
    assert r.status_code == 201, r.text
    nb = r.json()
    assert (nb["state"], nb["url"], nb["idle_limit_seconds"]) == ("queued", f"/notebooks/{nb['id']}/lab", 7200)
    listed = api.http.get("/v1/notebooks", headers=api.as_(alice)).json()
    assert [n["id"] for n in listed] == [nb["id"]]
    jobs = api.http.get("/v1/jobs", params={"kind": "notebook"}, headers=api.as_(alice)).json()
    assert [j["id"] for j in jobs] == [nb["id"]]
    queued = api.http.get(f"/notebooks/{nb['id']}/api/status", headers=api.as_(alice))
    assert queued.status_code == 503 and f"notebook {nb['id']} is queued" in queued.json()["error"]["message"]
    page = api.http.get(f"/notebooks/{nb['id']}/lab", headers={**api.as_(alice), "Accept": "text/html"})
    assert page.status_code == 503 and 'http-equiv="refresh"' in page.text  # the page waits for it
    stopped = api.http.post(f"/v1/notebooks/{nb['id']}/stop", headers=api.as_(alice)).json()
    assert stopped["state"] == "stopped"
    again = api.http.post(f"/v1/notebooks/{nb['id']}/resume", json={"idle_seconds": 600}, headers=api.as_(alice))
    assert again.status_code == 200 and again.json()["idle_limit_seconds"] == 600
    assert again.json()["state"] == "queued"


def test_the_proxy_sends_the_notebooks_token_and_nothing_of_the_callers(api, running_notebook):
    nb, alice = running_notebook
    base = f"/notebooks/{nb['id']}"
    r = api.http.post(base + "/api/contents/x.ipynb?type=notebook", content=b'{"cells": []}',
                      headers={**api.as_(alice), "Content-Type": "application/json", "Cookie": "_xsrf=abc"})
    assert r.status_code == 201, r.text
    seen = r.json()
    assert (seen["method"], seen["path"], seen["body"]) == ("POST", f"{base}/api/contents/x.ipynb?type=notebook",
                                                            '{"cells": []}')
    assert seen["headers"]["authorization"] == f"token {notebook_secret(nb['id'])}"
    assert alice not in json.dumps(seen) and seen["headers"]["cookie"] == "_xsrf=abc"

    console = Browser(api, alice)  # signed in to the console: its cookie opens it, and is not passed on
    page = console.get(base + "/lab")
    assert page.status_code == 200 and page.json()["path"] == f"{base}/lab"
    assert "deeppod_console" not in page.json()["headers"].get("cookie", "")
    assert api.http.get(base, follow_redirects=False).headers["location"] == f"{base}/lab"

    api.ctx.audit.flush()
    audited = api.http.get("/v1/audit", headers=api.as_(api.admin)).json()
    assert any(e["path"] == f"{base}/api/contents/x.ipynb" and e["user"] == "alice" for e in audited)


def test_nobody_else_reaches_a_notebook(api, running_notebook):
    nb, alice = running_notebook
    base = f"/notebooks/{nb['id']}/api/status"
    assert api.http.get(base, headers=api.as_(api.admin)).status_code == 200  # an administrator may
    mate, other = api.user("carol", "lab"), api.user("eve", "other")
    for token in (mate, other):
        r = api.http.get(base, headers=api.as_(token))
        assert r.status_code == 404 and "not found" in r.json()["error"]["message"]
    assert api.http.get(base).status_code == 401
    assert api.http.get(base, headers={"Authorization": "Bearer dp_nonsense"}).status_code == 401
    browser = api.http.get(f"/notebooks/{nb['id']}/lab", headers={"Accept": "text/html"}, follow_redirects=False)
    assert browser.status_code == 303 and browser.headers["location"] == f"/login?next=/notebooks/{nb['id']}/lab"
    reader = api.http.post("/v1/tokens", json={"name": "ro", "scope": "read"}, headers=api.as_(alice)).json()["token"]
    r = api.http.get(base, headers=api.as_(reader))
    assert r.status_code == 403 and "runs code" in r.json()["error"]["message"]
    with api.ctx.sessions.begin() as s:  # a job's own token (the notebook's, even): not a way in
        job_token = issue_job_token(s, s.get(Job, nb["id"]).user_id, nb["id"], ALL)
    assert api.http.get(base, headers=api.as_(job_token)).status_code == 404


def test_a_plans_idle_limit_caps_what_a_notebook_may_ask(api):
    alice = api.user("alice", "lab")
    plan = {"tenants": [{"name": "lab", "guaranteed": 0, "notebook_idle_hours": 1}]}
    assert api.http.put("/v1/plan", json=plan, headers=api.as_(api.admin)).status_code in (200, 201)
    r = api.http.post("/v1/notebooks", json={"idle_seconds": 7200}, headers=api.as_(alice))
    assert r.status_code == 422 and "plan allows" in r.json()["error"]["message"]
    assert api.http.post("/v1/notebooks", json={}, headers=api.as_(alice)).json()["idle_limit_seconds"] == 3600
