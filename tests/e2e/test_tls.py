"""https end to end: a self-signed server, the SDK and CLI verifying it, and a job's runtime
reporting to it over TLS."""

import json
import os
import ssl
import subprocess
import sys

import httpx
import pytest

from deeppod.errors import DeepPodError
from deeppod.sdk.client import Client
from tests.helpers import LiveServer


@pytest.fixture(params=[None, "single-user"], ids=["default-isolation", "single-user"])
def tls_server(tmp_path, request):
    """The default isolation (sandboxed jobs, as root) and none: a sandboxed job sees the CA."""
    server = LiveServer(tmp_path / "home", tls=True, isolation=request.param).start()
    yield server
    server.stop()
    server.cleanup_jobs()


def test_https_is_verified_and_jobs_report_over_it(tls_server, tmp_path):
    s = tls_server
    assert (s.home / "tls" / "key.pem").stat().st_mode & 0o777 == 0o600
    with Client(s.url, s.admin_token, ca_cert=str(s.ca_cert)) as c:
        assert c.whoami()["user"] == "admin"
        # a job's runtime verifies the server with the CA file it is handed, and its reports arrive
        code = ("from deeppod.runtime import report; from deeppod.runtime.metrics import reporter; "
                "report(1, loss=0.25); assert reporter().flush()")
        job = c.submit([sys.executable, "-c", code], own_folder=True, name="tls-report")
        done = c.wait(job["id"], timeout=120)
        assert done["state"] == "succeeded", done
        assert c.metrics(job["id"])["metrics"]["loss"]["series"] == [[1, 0.25]]
    # without the CA the certificate is refused; plain http on the port gets nothing
    with pytest.raises(DeepPodError):
        with Client(s.url, s.admin_token) as c:
            c.whoami()
    with pytest.raises(httpx.TransportError):
        httpx.get(s.url.replace("https", "http") + "/healthz", timeout=3)
    ctx = ssl.create_default_context(cafile=str(s.ca_cert))
    assert httpx.get(s.url + "/healthz", verify=ctx).status_code == 200
    # the CLI on this machine finds the server and its CA by itself
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPPOD_")}
    env.update({"DEEPPOD_HOME": str(s.home), "DEEPPOD_CONFIG": str(s.home / "client.json")})
    out = subprocess.run([sys.executable, "-m", "deeppod.cli", "whoami"], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "admin" in out.stdout, out.stderr
    assert json.loads((s.home / "server.json").read_text())["ca_cert"] == str(s.ca_cert)
