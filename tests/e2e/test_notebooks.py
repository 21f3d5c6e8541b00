"""A notebook as a user gets one: JupyterLab started as a job in the tenant's sandbox (the
server's defaults: sandboxed as root, a GPU slot), reached only through the control plane's
proxy: its status and a kernel over HTTP, a cell executed over the kernel's WebSocket, a
terminal over its WebSocket; another tenant, a tenant-mate and nobody signed in are turned
away; idle, it is stopped and its GPU freed; resumed, the file written before is there."""

import json
import os
import re
import sys
import uuid

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from deeppod import Client
from deeppod.executor import sandbox
from tests.e2e.browser import shot, sign_in
from tests.helpers import LiveServer, wait_until, wheel

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sandbox.supported() is not None,
                                                   reason=str(sandbox.supported()))]

CELL = ("import os, sys; open('kept.txt', 'w').write('written before the stop'); "
        "print('devices', os.environ.get('CUDA_VISIBLE_DEVICES'), 'uid', os.getuid())")
# the SDK in the notebook, with the notebook's own token: its owner submits from there
SUBMIT = ("import sys, deeppod; c = deeppod.Client(); "
          "print('job', c.jobs.submit([sys.executable, '-c', 'pass'], own_folder=True, gpus_per_worker=0)['id'])")


def _execute(url: str, token: str, kernel: str, code: str) -> str:
    """Run ``code`` in the kernel over its WebSocket (the proxy's); what it printed."""
    session = uuid.uuid4().hex
    ws_url = url.replace("http://", "ws://") + f"/api/kernels/{kernel}/channels?session_id={session}"
    with connect(ws_url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=30) as ws:
        msg_id = uuid.uuid4().hex
        ws.send(json.dumps({"header": {"msg_id": msg_id, "username": "test", "session": session,
                                       "msg_type": "execute_request", "version": "5.3"},
                            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                            "content": {"code": code, "silent": False, "store_history": False,
                                        "user_expressions": {}, "allow_stdin": False}}))
        printed, replied, idle = "", False, False
        while not (replied and idle):  # the reply (shell) may pass the last output (iopub): the kernel's idle ends it
            msg = json.loads(ws.recv(timeout=60))
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                printed += msg["content"]["text"]
            elif msg["msg_type"] == "execute_reply":
                assert msg["content"]["status"] == "ok", msg["content"]
                replied = True
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                idle = True
        return printed


def _terminal(url: str, token: str) -> str:
    auth = {"Authorization": f"Bearer {token}"}
    made = httpx.post(url + "/api/terminals", headers=auth, timeout=30)
    assert made.status_code == 200, made.text
    name = made.json()["name"]
    ws_url = url.replace("http://", "ws://") + f"/terminals/websocket/{name}"
    with connect(ws_url, additional_headers=auth, open_timeout=30) as ws:
        ws.send(json.dumps(["stdin", "echo term-uid-$(id -u)\r"]))
        seen = ""
        while not re.search(r"term-uid-\d+\r?\n", seen):  # the line whole (the echoed command has no digits)
            kind, *rest = json.loads(ws.recv(timeout=30))
            if kind == "stdout":
                seen += rest[0]
    httpx.delete(url + f"/api/terminals/{name}", headers=auth, timeout=30)
    return seen


def test_a_notebook_is_reached_only_through_the_proxy_idles_out_and_resumes_with_its_files(tmp_path):
    server = LiveServer(tmp_path / "home", isolation=None, extra_env={"DEEPPOD_NOTEBOOK_IDLE_INTERVAL": "0.5"}).start()
    try:
        admin = Client(server.url, server.admin_token)
        admin.create_tenant("lab")
        admin.create_tenant("other")
        alice = admin.create_user("alice", "lab")["token"]
        bob = admin.create_user("bob", "lab")["token"]  # alice's tenant-mate
        eve = admin.create_user("eve", "other")["token"]
        as_alice = {"Authorization": f"Bearer {alice}"}

        started = httpx.post(server.url + "/v1/notebooks", json={"name": "explore"}, headers=as_alice, timeout=30)
        assert started.status_code == 201, started.text
        nb = started.json()
        assert nb["url"] == f"/notebooks/{nb['id']}/lab" and nb["gpus_per_worker"] == 1
        assert nb["idle_limit_seconds"] == 7200  # the server's default: the plan names none
        base = f"{server.url}/notebooks/{nb['id']}"

        def status():
            r = httpx.get(base + "/api/status", headers=as_alice, timeout=30)
            return r.json() if r.status_code == 200 else None
        assert wait_until(status, 120, 0.5, "the notebook's Jupyter server through the proxy")["kernels"] == 0

        # nobody signed in, another tenant, a tenant-mate: nothing of it
        assert httpx.get(base + "/api/status", timeout=30).status_code == 401
        for other in (eve, bob):
            refused = httpx.get(base + "/api/status", headers={"Authorization": f"Bearer {other}"}, timeout=30)
            assert refused.status_code == 404 and "not found" in refused.json()["error"]["message"]
            with pytest.raises(InvalidStatus) as no_socket:
                connect(base.replace("http://", "ws://") + "/api/events/subscribe",
                        additional_headers={"Authorization": f"Bearer {other}"}, open_timeout=30)
            assert no_socket.value.response.status_code == 404
        lab = httpx.get(base + "/lab", headers={"Accept": "text/html"}, timeout=30)
        assert lab.status_code == 303 and lab.headers["location"].startswith("/login?next=")
        # what listens: a socket in its own folder, its tenant's, no port
        workdir = server.home / "jobs" / str(nb["id"]) / "code"
        sock = workdir / ".deeppod-notebook.sock"
        assert sock.is_socket() and sock.stat().st_uid not in (0, os.getuid())

        kernel = httpx.post(base + "/api/kernels", json={"name": "python3"}, headers=as_alice, timeout=60)
        assert kernel.status_code == 201, kernel.text
        printed = _execute(base, alice, kernel.json()["id"], CELL)
        devices, uid = printed.split()[1], int(printed.split()[3])
        assert devices.isdigit() and uid == sock.stat().st_uid, printed  # its GPU slot, the tenant's identity
        assert f"term-uid-{uid}" in _terminal(base, alice)
        submitted = int(_execute(base, alice, kernel.json()["id"], SUBMIT).split()[1])
        done = admin.wait(submitted, timeout=120)
        assert (done["state"], done["user"], done["tenant"]) == ("succeeded", "alice", "lab")

        # its stop keeps its folder; resumed with a short idle limit, it is stopped as idle
        assert httpx.post(f"{server.url}/v1/notebooks/{nb['id']}/stop", headers=as_alice,
                          timeout=30).status_code == 200
        wait_until(lambda: admin.job(nb["id"])["state"] == "stopped", 60, 0.2, "the notebook to stop")
        again = httpx.post(f"{server.url}/v1/notebooks/{nb['id']}/resume", json={"idle_seconds": 2},
                           headers=as_alice, timeout=30)
        assert again.status_code == 200 and again.json()["idle_limit_seconds"] == 2
        job = wait_until(lambda: (j := admin.job(nb["id"]))["state"] == "stopped" and j["started_at"] and
                         (j["stop_reason"] or "").startswith("idle") and j, 180, 0.2, "the idle notebook to stop")
        assert job["stop_reason"].startswith("idle: no kernel or terminal activity for 2s"), job
        assert sum(n["gpus_used"] for n in admin.nodes()) == 0  # its GPU is free

        # resumed, it keeps the limit it was last given unless told another (2 s would stop it again)
        resumed = httpx.post(f"{server.url}/v1/notebooks/{nb['id']}/resume", json={"idle_seconds": 3600},
                             headers=as_alice, timeout=30)
        assert resumed.status_code == 200 and resumed.json()["idle_limit_seconds"] == 3600
        assert wait_until(status, 120, 0.5, "the resumed notebook")
        kept = httpx.get(base + "/api/contents/kept.txt", headers=as_alice, timeout=30)
        assert kept.status_code == 200 and kept.json()["content"] == "written before the stop", kept.text
        httpx.post(f"{server.url}/v1/notebooks/{nb['id']}/stop", headers=as_alice, timeout=30)
    finally:
        server.stop()
        server.cleanup_jobs()


def test_a_notebook_started_from_the_console_opens_jupyterlab_with_a_click(tmp_path, browser):
    server = LiveServer(tmp_path / "home", isolation=None).start()
    try:
        admin = Client(server.url, server.admin_token)
        admin.create_tenant("lab")
        alice = admin.create_user("alice", "lab")["token"]
        page = sign_in(browser, server.url, alice)
        page.click("nav.top >> text=Notebooks")
        page.wait_for_url(server.url + "/notebooks")
        page.fill("#start-notebook input[name=idle]", "forever")  # refused next to the field, nothing started
        page.click("#start")
        assert "forever" in page.inner_text("#e-idle") and admin.notebooks.list() == []
        page.fill("#start-notebook input[name=name]", "explore")
        page.fill("#start-notebook input[name=idle]", "45m")
        page.click("#start")
        page.wait_for_url(server.url + "/notebooks")
        nb = admin.notebooks.list()[0]
        assert (nb["name"], nb["idle_limit_seconds"], nb["user"]) == ("explore", 2700, "alice")
        assert "45m" in page.inner_text(f'tr[data-notebook="{nb["id"]}"]')

        def open_button():
            page.reload()
            return page.locator(f"#open-{nb['id']}").count() == 1
        wait_until(open_button, 120, 1.0, "the notebook to run and offer Open")
        shot(page, "notebooks")
        with page.context.expect_page() as opened:
            page.click(f"#open-{nb['id']}")
        lab = opened.value
        lab.wait_for_selector("#jp-main-dock-panel", timeout=120_000)  # JupyterLab's shell, drawn by its scripts
        lab.wait_for_selector(".jp-LauncherCard", timeout=120_000)  # its launcher: the kernel specs came through
        assert lab.url == f"{server.url}/notebooks/{nb['id']}/lab"
        shot(lab, "notebook-lab")
        lab.close()
        admin.notebooks.stop(nb["id"])
    finally:
        server.stop()
        server.cleanup_jobs()


def test_a_notebook_with_its_own_requirements_runs_jupyterlab_in_that_environment(tmp_path):
    """--requirements: the kernel runs in the notebook's own environment (its packages importable),
    JupyterLab itself coming from the server's."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel(wheels, "deeppod-probe", "1.0", "from the notebook's own environment")
    server = LiveServer(tmp_path / "home", isolation=None, extra_env={
        "DEEPPOD_ENV_FIND_LINKS": str(wheels), "DEEPPOD_ENV_NO_INDEX": "1"}).start()
    try:
        token = server.admin_token
        auth = {"Authorization": f"Bearer {token}"}
        nb = httpx.post(server.url + "/v1/notebooks", json={"requirements": "deeppod-probe==1.0\n",
                                                            "gpus_per_worker": 0}, headers=auth, timeout=30).json()
        base = f"{server.url}/notebooks/{nb['id']}"
        wait_until(lambda: httpx.get(base + "/api/status", headers=auth, timeout=30).status_code == 200, 300, 0.5,
                   "the notebook in its own environment")
        kernel = httpx.post(base + "/api/kernels", json={"name": "python3"}, headers=auth, timeout=60).json()["id"]
        printed = _execute(base, token, kernel, "import sys, deeppod_probe; print(deeppod_probe.VALUE, '|', "
                                                "sys.prefix)")
        value, prefix = (x.strip() for x in printed.split("|"))
        assert value == "from the notebook's own environment" and prefix != sys.prefix, printed
        httpx.post(f"{server.url}/v1/notebooks/{nb['id']}/stop", headers=auth, timeout=30)
    finally:
        server.stop()
        server.cleanup_jobs()
