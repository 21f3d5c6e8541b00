"""The server process itself: it tells local clients where it is, and cleans up when stopped."""

import json
import os
import signal
import subprocess
import sys

import httpx
import pytest

from deeppod.settings import local_server_record
from tests.helpers import wait_until


def test_the_server_announces_itself_and_forgets_on_sigterm(fresh_server):
    fresh_server.start()
    here = json.loads((fresh_server.home / "server.json").read_text())
    record = local_server_record(fresh_server.home, {"DEEPPOD_CONFIG": str(fresh_server.home / "client.json")})
    last = json.loads(record.read_text())  # beside DEEPPOD_CONFIG: how this user's CLI finds it
    assert here["url"] == fresh_server.url and here["pid"] == fresh_server.proc.pid == last["pid"]
    assert last["home"] == str(fresh_server.home)
    fresh_server.proc.send_signal(signal.SIGTERM)
    code = fresh_server.proc.wait(20)
    assert code in (0, 128 + signal.SIGTERM, -signal.SIGTERM)
    assert not (fresh_server.home / "server.json").exists()
    # no longer announced as running, but its URL is kept: the CLI names the port it last used
    assert json.loads(record.read_text())["pid"] is None
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPPOD_")}
    env.update({"DEEPPOD_CONFIG": str(fresh_server.home / "client.json"), "HOME": str(fresh_server.home)})
    p = subprocess.run([sys.executable, "-m", "deeppod.cli", "jobs"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0 and f"cannot reach the DeepPod server at {fresh_server.url}" in p.stderr, p.stderr


@pytest.mark.slow
def test_port_0_picks_a_free_port_and_announces_the_real_one(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPPOD_")}
    env.update({"DEEPPOD_HOME": str(tmp_path / "home"), "DEEPPOD_CONFIG": str(tmp_path / "client.json")})
    proc = subprocess.Popen([sys.executable, "-m", "deeppod.cli", "server", "--port", "0", "--gpus", "1"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        announced = tmp_path / "home" / "server.json"
        wait_until(announced.exists, 60, what="the server to announce itself")
        url = json.loads(announced.read_text())["url"]
        assert not url.endswith(":0")
        wait_until(lambda: _answers(url), 60, what="the server to answer at the announced URL")
        found = subprocess.run([sys.executable, "-m", "deeppod.cli", "nodes"], env=env, capture_output=True, text=True)
        assert found.returncode == 0, found.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def test_sandbox_isolation_refuses_work_roots_that_hold_the_servers_home(tmp_path):
    from deeppod.auth.identities import FakeIdentities
    from deeppod.errors import InvalidRequest
    from deeppod.server import isolation_for
    from deeppod.settings import Settings

    s = Settings(home=tmp_path / "srv" / "home", isolation="sandbox", work_roots=str(tmp_path / "work" / "{tenant}"))
    assert isolation_for(s, FakeIdentities()) is not None  # beside the home: fine
    with pytest.raises(InvalidRequest, match="holds the server.s home"):  # a tenant named "home" would get it
        isolation_for(Settings(home=tmp_path / "srv" / "home", isolation="sandbox",
                               work_roots=str(tmp_path / "srv" / "{tenant}")), FakeIdentities())
    with pytest.raises(InvalidRequest, match="holds the server's home"):
        isolation_for(Settings(home=tmp_path / "srv" / "home", isolation="sandbox", work_roots=str(tmp_path)),
                      FakeIdentities())
    with pytest.raises(InvalidRequest, match="use auto, sandbox, single-user or one-tenant"):
        isolation_for(Settings(isolation="jail"), FakeIdentities())
    assert isolation_for(Settings(home=tmp_path / "h", isolation="sandbox"), FakeIdentities()) is not None  # default


def test_sandbox_isolation_refuses_to_start_without_the_kernels_limits_unless_told(tmp_path, monkeypatch):
    from deeppod.errors import InvalidRequest
    from deeppod.executor import cgroups, sandbox
    from deeppod.server import isolation_for
    from deeppod.settings import Settings

    monkeypatch.setattr(sandbox, "supported", lambda: None)  # namespaces and root: as on a server
    monkeypatch.setattr(cgroups, "check", lambda: "cannot make control group x: Read-only file system")
    settings = Settings(home=tmp_path / "h", isolation="sandbox")
    with pytest.raises(InvalidRequest, match="--unenforced-limits") as refused:
        isolation_for(settings)
    assert "Read-only file system" in str(refused.value)
    went_on = isolation_for(Settings(home=tmp_path / "h", isolation="sandbox", unenforced_limits=True))
    assert went_on is not None and went_on.cgroups is False  # the memory poll stands in: docs/security.md
    monkeypatch.setattr(cgroups, "check", lambda: None)
    held = isolation_for(Settings(home=tmp_path / "h", isolation="sandbox", cpu_limit="quota", pids_per_worker=999))
    assert held.cgroups and held.cpu_quota and held.pids == 999
    for bad, words in (({"cpu_limit": "hard"}, "use share"), ({"pids_per_worker": 3}, "at least 16")):
        with pytest.raises(InvalidRequest, match=words):
            isolation_for(Settings(home=tmp_path / "h", isolation="sandbox", **bad))


def test_jobs_find_the_servers_own_python_first(monkeypatch):
    import os
    import sys

    from deeppod.server import prefer_own_python

    own = os.path.dirname(sys.executable)
    monkeypatch.setenv("PATH", f"/root/.pyenv/shims:/usr/bin:{own}")
    prefer_own_python()
    assert os.environ["PATH"].split(os.pathsep) == [own, "/root/.pyenv/shims", "/usr/bin"]
    prefer_own_python()  # once is enough: nothing doubles
    assert os.environ["PATH"].split(os.pathsep) == [own, "/root/.pyenv/shims", "/usr/bin"]


def test_one_server_per_sqlite_database(tmp_path):
    """A second server on the same SQLite file is refused (the kernel's lock on a file beside
    it, held while the first runs); several servers need PostgreSQL."""
    from deeppod.errors import InvalidRequest
    from deeppod.server import _only_server_of
    from deeppod.settings import Settings

    settings = Settings(home=tmp_path)
    first = _only_server_of(settings)
    with pytest.raises(InvalidRequest, match=rf"another DeepPod server \(pid {os.getpid()}\) uses the database .*"
                                             "PostgreSQL"):
        _only_server_of(settings)
    first.close()  # the first stopped (or died: the kernel drops the lock with the process)
    _only_server_of(settings).close()
    assert _only_server_of(Settings(home=tmp_path, database_url="postgresql+psycopg://x@127.0.0.1/db")) is None


def test_s3s_own_port_must_be_free_and_not_the_apis(tmp_path):
    import socket

    from deeppod.contract import free_port
    from deeppod.errors import InvalidRequest
    from deeppod.server import check_ports
    from deeppod.settings import Settings

    api = free_port()
    check_ports(Settings(home=tmp_path, port=api))
    with pytest.raises(InvalidRequest, match=f"--s3-port {api}: give a port of its own"):
        check_ports(Settings(home=tmp_path, port=api, s3_port=api))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(InvalidRequest, match="is another server running"):
            check_ports(Settings(home=tmp_path, port=api, s3_port=taken.getsockname()[1]))
