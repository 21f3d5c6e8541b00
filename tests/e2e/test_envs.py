"""Jobs' own Python environments (--requirements), for real, as root with sandboxing (the
default a user gets): built once per spec with uv as the tenant, in a sandbox, from the
server's package index (here a local folder of wheels: nothing is downloaded), cached,
rebuilt once removed; a bad spec fails with the installer's own message."""

import re
import subprocess
import sys

import pytest

from deeppod import Client
from deeppod.executor import sandbox
from tests.e2e.browser import shot, sign_in
from tests.helpers import LiveServer, wheel

pytestmark = pytest.mark.skipif(sandbox.supported() is not None, reason=str(sandbox.supported()))

PROBE = """
import importlib.metadata, sys
import deeppod_probe
import deeppod.runtime  # the platform's runtime stays importable in the job's own environment
print("probe", importlib.metadata.version("deeppod-probe"), deeppod_probe.VALUE, "prefix", sys.prefix, flush=True)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("envs")
    wheels = root / "wheels"
    wheels.mkdir()
    wheel(wheels, "deeppod-probe", "1.2.3", "pinned")
    wheel(wheels, "deeppod-probe", "2.0.0", "newest")
    s = LiveServer(root / "home", isolation=None, extra_env={
        "DEEPPOD_ENV_FIND_LINKS": str(wheels), "DEEPPOD_ENV_NO_INDEX": "1"}).start()
    yield s
    s.stop()
    s.cleanup_jobs()


def _log(server, job_id) -> str:
    return (server.home / "jobs" / str(job_id) / "logs" / "rank-0.log").read_text()


def test_jobs_with_the_same_requirements_share_one_build(server, tmp_path):
    c = Client(server.url, server.admin_token)
    if c.whoami()["isolation"] != "sandbox":
        pytest.skip("needs a root server (sandbox isolation)")
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "requirements.txt").write_text("deeppod-probe==1.2.3  # pinned below the newest\n")
    jobs = [c.submit(["python", "probe.py"], code=str(tmp_path), gpus_per_worker=0,
                     requirements=tmp_path / "requirements.txt") for _ in range(2)]
    done = [c.wait(j["id"], timeout=300) for j in jobs]
    logs = [_log(server, j["id"]) for j in jobs]
    assert all(d["state"] == "succeeded" for d in done), logs
    for out in logs:
        assert "probe 1.2.3 pinned prefix" in out, out
    assert sum(out.count("[deeppod] building environment") for out in logs) == 1, logs
    key = done[0]["env_key"]
    assert key and done[1]["env_key"] == key and f"/envs/{1}/{key}" in logs[0]  # the admin's tenant is 1
    assert done[0]["requirements"] == "deeppod-probe==1.2.3"
    envs = c.envs()
    assert [e["key"] for e in envs] == [key] and envs[0]["requirements"] == ["deeppod-probe==1.2.3"]
    assert envs[0]["bytes"] > 0 and envs[0]["active_jobs"] == []

    # removed, the next job that needs it builds it again
    c.remove_env(key)
    assert c.envs() == []
    again = c.submit(["python", "probe.py"], code=str(tmp_path), gpus_per_worker=0,
                     requirements=["deeppod-probe==1.2.3"])
    assert c.wait(again["id"], timeout=300)["state"] == "succeeded"
    assert "[deeppod] building environment" in _log(server, again["id"])


def test_a_requirement_that_cannot_be_met_fails_with_the_installers_message(server, tmp_path):
    c = Client(server.url, server.admin_token)
    if c.whoami()["isolation"] != "sandbox":
        pytest.skip("needs a root server (sandbox isolation)")
    (tmp_path / "probe.py").write_text(PROBE)
    job = c.submit(["python", "probe.py"], code=str(tmp_path), gpus_per_worker=0, requirements=["deeppod-probe==9.9.9"])
    done = c.wait(job["id"], timeout=300)
    assert done["state"] == "failed", done
    assert "could not build its Python environment" in done["reason"] and "9.9.9" in done["reason"], done["reason"]
    assert "check the requirements" in done["reason"]
    for bad, words in (("--index-url http://evil/simple\nnumpy", "does not let tenant 'default'"),
                       ("git+https://example.com/x.git", "not a package requirement"),
                       ("./local/path", "not a package requirement"),
                       # a misspelt name: refused at submit, not when the build fails minutes later
                       ("deeppod-prob==1.2.3", "no package named 'deeppod-prob' in this server's folder of packages "
                                               r"\(no index\); did you mean 'deeppod-probe'\?")):
        with pytest.raises(Exception, match=words):
            c.submit(["python", "probe.py"], code=str(tmp_path), gpus_per_worker=0, requirements=bad)
    assert sys.version_info >= (3, 11)


def test_the_console_submits_a_job_with_its_own_requirements(server, browser, tmp_path):
    """The submit form's requirements field: a bad line is refused next to it; a good one runs
    in the environment, and the job's page says it succeeded."""
    c = Client(server.url, server.admin_token)
    folder = server.home / "work" / "default"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "probe.py").write_text(PROBE)
    page = sign_in(browser, server.url, server.admin_token)
    page.goto(server.url + "/jobs/new")
    page.fill("#f-command", "python probe.py")
    page.fill("#f-gpus_per_worker", "0")
    page.fill("#f-workdir", str(folder))
    page.fill("#f-requirements", "deeppod-probe==2.0.0\n--find-links http://elsewhere/wheels")
    page.click("#submit-form button[type=submit]")
    assert "not a package requirement" in page.inner_text("#e-requirements")
    page.fill("#f-requirements", "deeppod-probe==2.0.0\n--index-url http://elsewhere/simple")
    page.click("#submit-form button[type=submit]")
    assert "package_indexes" in page.inner_text("#e-requirements")
    page.fill("#f-requirements", "deeppod-probe==2.0.0")
    page.click("#submit-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/jobs/\d+$"))
    job_id = int(page.url.rsplit("/", 1)[1])
    done = c.wait(job_id, timeout=300)
    assert done["state"] == "succeeded" and done["requirements"] == "deeppod-probe==2.0.0", done
    assert "probe 2.0.0 newest" in _log(server, job_id)
    page.reload()
    page.wait_for_selector("#job-state")
    assert "succeeded" in page.inner_text("#job-state")
    assert "deeppod-probe==2.0.0" in page.inner_text("#job-env")
    shot(page, "job-own-environment")
    page.context.close()


def test_a_package_index_the_plan_allows_serves_the_build(server, tmp_path):
    """A requirements file names a package index (here a simple index served on loopback);
    refused until the tenant's plan allows it, then the build installs from it alone."""
    c = Client(server.url, server.admin_token)
    if c.whoami()["isolation"] != "sandbox":
        pytest.skip("needs a root server (sandbox isolation)")
    simple = tmp_path / "simple" / "deeppod-probe"
    simple.mkdir(parents=True)
    wheel(simple, "deeppod-probe", "3.1.4", "from-the-index")
    index = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "0"],
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        port = int(re.search(r"port (\d+)", index.stdout.readline()).group(1))
        url = f"http://127.0.0.1:{port}/simple"
        (tmp_path / "probe.py").write_text(PROBE)
        reqs = [f"--index-url {url}", "deeppod-probe==3.1.4"]
        with pytest.raises(Exception, match="package_indexes"):
            c.submit(["python", "probe.py"], code=str(tmp_path), gpus_per_worker=0, requirements=reqs)
        before = c.plan()
        c.apply_plan({"tenants": [{"name": "default", "guaranteed": 0, "package_indexes": [url]}]})
        try:
            job = c.submit(["python", "probe.py"], code=str(tmp_path), gpus_per_worker=0, requirements=reqs)
            done = c.wait(job["id"], timeout=300)
        finally:
            c.apply_plan({k: v for k, v in before.items() if k in ("tenants", "reclaim_idle_first")})
        assert done["state"] == "succeeded", _log(server, job["id"])
        assert "probe 3.1.4 from-the-index" in _log(server, job["id"])  # not in the server's wheelhouse
    finally:
        index.kill()
        index.wait()
