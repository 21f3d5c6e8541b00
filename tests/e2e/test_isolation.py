"""A hostile tenant's job against a server that isolates (DEEPPOD_ISOLATION=sandbox, as root):
every attack fails and the victim's job still succeeds. Skipped where the server could not
isolate (not root); CI runs as root."""

import json
import os
import sys

import httpx
import pytest

from deeppod import Client
from deeppod.executor import sandbox
from tests.helpers import LiveServer, wait_until

pytestmark = pytest.mark.skipif(sandbox.supported() is not None, reason=str(sandbox.supported()))

VICTIM = """
import os, sys, time
ckpt = os.path.join(os.environ["DEEPPOD_CHECKPOINT_DIR"], "ckpt-1.pt")
open(ckpt, "w").write("the victim's weights")
print("victim ready", flush=True)
time.sleep(float(sys.argv[1]))
assert open(ckpt).read() == "the victim's weights", "the checkpoint was changed"
print("victim done", flush=True)
"""

ATTACK = """
import json, os, signal, sys
home, victim_dir, victim_pids = sys.argv[1], sys.argv[2], [int(p) for p in sys.argv[3:]]
tried = {}
def attempt(name, fn):
    try:
        fn()
        tried[name] = "succeeded"
    except (OSError, ValueError) as exc:
        tried[name] = type(exc).__name__
attempt("read the admin token", lambda: open(os.path.join(home, "admin.token")).read())
attempt("read the database", lambda: open(os.path.join(home, "deeppod.db"), "rb").read(100))
attempt("list the victim's folder", lambda: os.listdir(victim_dir))
attempt("overwrite the victim's checkpoint",
        lambda: open(os.path.join(victim_dir, "checkpoints", "ckpt-1.pt"), "w").write("garbage"))
for pid in victim_pids:
    attempt(f"kill the victim's process {pid}", lambda: os.kill(pid, signal.SIGKILL))
others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) > 2]
tried["other processes visible"] = others
tried["server secret in env"] = "CLOUD_SECRET" in os.environ
tried["uid"] = os.getuid()
print(json.dumps(tried))
"""


def test_a_hostile_tenant_job_reaches_neither_the_server_nor_another_tenant(tmp_path):
    work = tmp_path / "work"
    for tenant in ("lab", "evil"):
        (work / tenant).mkdir(parents=True)
    (work / "lab" / "victim.py").write_text(VICTIM)
    (work / "evil" / "attack.py").write_text(ATTACK)
    server = LiveServer(tmp_path / "home", extra_env={
        "DEEPPOD_ISOLATION": "sandbox", "DEEPPOD_WORK_ROOTS": str(work / "{tenant}"),
        "CLOUD_SECRET": "s3cr3t"}).start()
    try:
        admin = Client(server.url, server.admin_token)
        tokens = {}
        for user, tenant in (("alice", "lab"), ("mallory", "evil")):
            admin.create_tenant(tenant)
            tokens[user] = admin.create_user(user, tenant)["token"]
        alice, mallory = Client(server.url, tokens["alice"]), Client(server.url, tokens["mallory"])

        victim = alice.submit([sys.executable, "victim.py", "12"], workdir=str(work / "lab"), gpus_per_worker=0)
        victim_dir = server.home / "jobs" / str(victim["id"])
        wait_until(lambda: (victim_dir / "workers.json").exists() and b"victim ready" in _log(victim_dir), 60,
                   what="the victim to start")
        victim_pids = [str(p) for p in json.loads((victim_dir / "workers.json").read_text()).values()]

        # the API refuses a workdir outside the tenant's roots, saying the same whether it exists or not
        for elsewhere in (work / "lab", server.home, tmp_path / "no-such-folder"):
            with pytest.raises(Exception) as refused:
                mallory.submit([sys.executable, "attack.py"], workdir=str(elsewhere), gpus_per_worker=0)
            assert getattr(refused.value, "status", None) == 403 and "tenant's roots" in str(refused.value)

        attack = mallory.submit([sys.executable, "attack.py", str(server.home), str(victim_dir), *victim_pids],
                                workdir=str(work / "evil"), gpus_per_worker=0)
        done = mallory.wait(attack["id"], timeout=60)
        out = _log(server.home / "jobs" / str(attack["id"])).decode()
        assert done["state"] == "succeeded", out
        tried = json.loads(out.strip().splitlines()[-1])
        for name, result in tried.items():
            if name.startswith(("read", "list", "overwrite", "kill")):
                assert result != "succeeded", f"{name}: {result}"
        assert tried["other processes visible"] == [] and tried["server secret in env"] is False
        assert tried["uid"] not in (0, os.getuid())  # never the server's identity

        final = alice.wait(victim["id"], timeout=90)
        assert final["state"] == "succeeded", _log(victim_dir).decode()
        assert b"victim done" in _log(victim_dir)
        assert oct(server.home.stat().st_mode & 0o777) == "0o700"
        assert oct((server.home / "deeppod.db").stat().st_mode & 0o777) == "0o600"
        assert httpx.get(server.url + "/healthz").status_code == 200
    finally:
        server.stop()
        server.cleanup_jobs()


def _log(job_dir) -> bytes:
    try:
        return (job_dir / "logs" / "rank-0.log").read_bytes()
    except OSError:
        return b""
