"""An ingest is all or nothing: a client killed mid-upload, and a server killed with -9
mid-ingest, leave no version and no files behind."""

import os
import signal
import subprocess
import sys
import textwrap

import httpx
import pytest

from tests.datasets.images import class_folders
from tests.helpers import wait_until

pytestmark = pytest.mark.slow

# Sends the first half of the archive, then stalls: the server is mid-upload when we strike.
STALLING_CLIENT = textwrap.dedent("""
    import sys, time, httpx
    from deeppod.sdk.sources import open_source
    body = b"".join(open_source(sys.argv[3]).chunks(None))
    def chunks():
        yield body[: len(body) // 2]
        time.sleep(120)
        yield body[len(body) // 2:]
    httpx.post(sys.argv[1] + "/v1/datasets/pets/versions", content=chunks(), timeout=None,
               headers={"Authorization": "Bearer " + sys.argv[2], "content-type": "application/x-tar"})
""")


def _files(home):
    root = home / "data"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def _spooling(home):
    return list((home / "data" / "hot" / ".staging").glob("upload-*"))


def _start_upload(server, src):
    return subprocess.Popen([sys.executable, "-c", STALLING_CLIENT, server.url, server.admin_token, str(src)])


def _datasets(server):
    r = httpx.get(server.url + "/v1/datasets", headers={"Authorization": f"Bearer {server.admin_token}"})
    return [(d["name"], len(d["versions"])) for d in r.json()]


def test_client_killed_mid_upload_leaves_nothing(fresh_server, tmp_path):
    server = fresh_server.start()
    src = class_folders(tmp_path / "src", per_class=40, size=(120, 100))
    client = _start_upload(server, src)
    try:
        wait_until(lambda: _spooling(server.home), 30, what="the upload to start")
        os.kill(client.pid, signal.SIGKILL)
        client.wait()
        wait_until(lambda: not _files(server.home), 30, what="the server to drop the half upload")
    finally:
        if client.poll() is None:
            client.kill()
    assert _datasets(server) == []


def test_server_killed_mid_ingest_recovers_to_nothing(fresh_server, tmp_path):
    server = fresh_server.start()
    src = class_folders(tmp_path / "src", per_class=40, size=(120, 100))
    client = _start_upload(server, src)
    try:
        wait_until(lambda: _spooling(server.home), 30, what="the upload to start")
        server.kill9()
    finally:
        client.kill()
        client.wait()
    assert _files(server.home)  # the crash left a half upload behind
    server.start()
    assert _files(server.home) == [] and _datasets(server) == []
    # and the store works afterwards
    from deeppod import Client

    v = Client(server.url, server.admin_token).ingest("pets", str(src))["versions"][0]
    assert v["ref"] == "pets@1" and v["samples"] == 80
