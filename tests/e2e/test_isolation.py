"""A hostile tenant's job against a server that isolates (DEEPPOD_ISOLATION=sandbox, as root):
every attack fails and the victim's job still succeeds. Skipped where the server could not
isolate (not root); CI runs as root."""

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from deeppod import Client
from deeppod.executor import sandbox
from deeppod.jobs.launch import shm_name
from deeppod.settings import Settings
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
for pid in victim_pids:
    attempt(f"read the victim's worker {pid} environment", lambda: open(f"/proc/{pid}/environ").read())
# with its own job token, through the API
import urllib.error, urllib.request
victim_id = int(os.path.basename(victim_dir))
def api_attempt(name, method, path, body=None):
    req = urllib.request.Request(os.environ["DEEPPOD_API_URL"] + path, method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": "Bearer " + os.environ["DEEPPOD_TOKEN"],
                                          "Content-Type": "application/json"})
    try:
        tried[name] = f"succeeded {urllib.request.urlopen(req, timeout=10).status}"
    except urllib.error.HTTPError as exc:
        tried[name] = exc.code
api_attempt("api: make itself an admin", "POST", "/v1/users", {"name": "mallory2", "tenant": "evil", "admin": True})
api_attempt("api: announce a replica for the victim (SSRF)", "PUT", f"/v1/replicas/{victim_id}",
            {"url": "http://169.254.169.254/latest", "version": 1})
api_attempt("api: announce its own job as a replica (SSRF)", "PUT", f"/v1/replicas/{os.environ['DEEPPOD_JOB_ID']}",
            {"url": "http://169.254.169.254/latest", "version": 1})
api_attempt("api: register the victim's folder as a model", "POST", "/v1/models/stolen/versions",
            {"path": victim_dir})
api_attempt("api: read the victim's job", "GET", f"/v1/jobs/{victim_id}")
api_attempt("api: cancel the victim", "POST", f"/v1/jobs/{victim_id}/cancel")
# devices: a GPU the scheduler gave another job (no node in its /dev, and it cannot make one)
import stat, threading
attempt("open a GPU device it was not given", lambda: open("/dev/nvidia0", "rb"))
attempt("make a GPU device node", lambda: os.mknod("/tmp/nvidia9", stat.S_IFCHR | 0o666, os.makedev(195, 9)))
# a thread bomb: the kernel's pids limit (the default a user gets) stops it, not the host
gate, threads = threading.Event(), []
try:
    while len(threads) < 20000:
        t = threading.Thread(target=gate.wait)
        t.start()
        threads.append(t)
except RuntimeError:
    pass
gate.set()
tried["threads started"] = len(threads)
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
            if name.startswith(("read", "list", "overwrite", "kill", "open", "make")):
                assert result != "succeeded", f"{name}: {result}"
            if name.startswith("api:"):
                assert isinstance(result, int) and 400 <= result < 500, f"{name}: {result}"
        assert sum(name.startswith("api:") for name in tried) == 6
        assert tried["other processes visible"] == [] and tried["server secret in env"] is False
        assert tried["uid"] not in (0, os.getuid())  # never the server's identity
        assert tried["threads started"] < 4096  # DEEPPOD_PIDS_PER_WORKER's default, the kernel's pids limit

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


TRAIN = """
import os
import torch
import torch.distributed as dist
from helper import GREETING
dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 0:
    open("/dev/shm/from-rank-0", "w").write("shared")
dist.barrier()
shm = open("/dev/shm/from-rank-0").read()  # the job's workers share /dev/shm (NCCL needs it)
total = torch.ones(1)
dist.all_reduce(total)
if rank == 0:
    open("out.txt", "w").write(GREETING)
print("uid", os.getuid(), "cwd", os.getcwd(), "world", int(total.item()), "shm", shm,
      "files", sorted(os.listdir(".")), flush=True)
dist.destroy_process_group()
"""


def test_the_defaults_sandbox_as_root_and_submit_sends_the_code(tmp_path):
    """A server started as a user would (no isolation setting) runs jobs sandboxed; `deeppod
    submit` from a project folder outside the tenant's roots sends the folder with the job,
    and a 2-worker torch.distributed job runs in it."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(TRAIN)
    (project / "helper.py").write_text("GREETING = 'hello from the sent code'\n")
    (project / ".git").mkdir()  # not sent
    server = LiveServer(tmp_path / "home", isolation=None).start()
    try:
        me = Client(server.url, server.admin_token).whoami()
        assert me["isolation"] == "sandbox" and me["work_roots"] == [str(server.home / "work" / "default")]
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPPOD_")}
        env.update(DEEPPOD_API_URL=server.url, DEEPPOD_TOKEN=server.admin_token)
        p = subprocess.run([sys.executable, "-m", "deeppod.cli", "submit", "-f", "--workers", "2", "--",
                            sys.executable, "train.py"],
                           cwd=project, env=env, capture_output=True, text=True, timeout=180)
        assert p.returncode == 0, p.stdout + p.stderr
        job = Client(server.url, server.admin_token).jobs()[0]
        assert job["state"] == "succeeded", p.stdout
        workdir = server.home / "jobs" / str(job["id"]) / "code"
        assert job["workdir"] == str(workdir)
        lines = [x for x in p.stdout.splitlines() if "uid" in x]
        assert len(lines) == 2 and all("world 2 shm shared" in x for x in lines), p.stdout
        line = lines[0]
        uid = int(line.split("uid ", 1)[1].split()[0])
        assert uid not in (0, os.getuid()) and f"cwd {workdir}" in line
        assert "'helper.py'" in line and "'train.py'" in line and ".git" not in line
        assert (workdir / "out.txt").read_text() == "hello from the sent code"
        assert (workdir / "out.txt").stat().st_uid == uid  # written as the tenant, in its own copy
        assert not (project / "out.txt").exists()
        instance = Settings(home=server.home).instance
        assert not (Path("/dev/shm") / shm_name(instance, job["id"])).exists()  # gone with the job
        user = pwd.getpwuid(uid).pw_name
        assert user.startswith(f"deeppod-{instance}-t")  # this installation's: another one on the host has its own
    finally:
        server.stop()
        server.cleanup_jobs()


def test_a_job_over_its_memory_is_stopped_by_the_kernel_and_says_so(tmp_path):
    """--memory is a hard limit the kernel holds, whatever the job does to slip out of a
    poll (a child in its own session here); the job ends failed, saying why."""
    server = LiveServer(tmp_path / "home", isolation=None).start()
    try:
        c = Client(server.url, server.admin_token)
        if c.whoami()["isolation"] != "sandbox" or "not enforced by the kernel" in server.output.read_text():
            pytest.skip("needs a root server with usable cgroups")
        hog = ("import os, subprocess, sys\n"
               "c = subprocess.Popen([sys.executable, '-c', 'import os; os.setsid(); "
               "x = bytearray(768 << 20); x[::4096] = b\"1\" * len(x[::4096])'])\n"
               "sys.exit(c.wait() and 1)\n")
        job = c.submit([sys.executable, "-c", hog], memory_mb_per_worker=256, gpus_per_worker=0, own_folder=True)
        done = c.wait(job["id"], timeout=120)
        assert done["state"] == "failed", done
        assert "out of memory (limit 256 MiB)" in done["reason"], done["reason"]
    finally:
        server.stop()
        server.cleanup_jobs()


LISTENER = """
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
s.settimeout(float(sys.argv[2]))
print("listening", flush=True)
try:
    s.accept()
    print("victim reached", flush=True)
except socket.timeout:
    print("nobody came", flush=True)
"""

ISOLATED = """
import json, os, socket, sys, urllib.request
import torch, torch.distributed as dist
dist.init_process_group("gloo")  # its workers meet on their own loopback
total = torch.ones(1)
dist.all_reduce(total)
tried = {"world": int(total.item())}
for name, port in (("the victim's port", int(sys.argv[1])), ("the host's ssh", 22)):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
        tried[name] = "reached"
    except OSError as exc:
        tried[name] = type(exc).__name__
req = urllib.request.Request(os.environ["DEEPPOD_API_URL"].split(",")[0] + "/v1/whoami",
                             headers={"Authorization": "Bearer " + os.environ["DEEPPOD_TOKEN"]})
tried["api"] = json.load(urllib.request.urlopen(req, timeout=10))["user"]
if dist.get_rank() == 0:
    print(json.dumps(tried), flush=True)
dist.destroy_process_group()
"""


def test_a_job_in_its_own_network_reaches_the_api_and_nothing_else(tmp_path):
    """--network isolated: the job's workers meet on their own loopback and reach the API through
    the proxy; another job's port on the host is out of reach (and theirs out of everyone's)."""
    from tests.helpers import free_port

    server = LiveServer(tmp_path / "home", isolation=None).start()
    try:
        admin = Client(server.url, server.admin_token)
        if admin.whoami()["isolation"] != "sandbox":
            pytest.skip("needs a root server (sandbox isolation)")
        tokens = {}
        for user, tenant in (("alice", "lab"), ("mallory", "evil")):
            admin.create_tenant(tenant)
            tokens[user] = admin.create_user(user, tenant)["token"]
        alice, mallory = Client(server.url, tokens["alice"]), Client(server.url, tokens["mallory"])
        port = free_port()
        code = tmp_path / "code"
        code.mkdir()
        (code / "listener.py").write_text(LISTENER)
        (code / "isolated.py").write_text(ISOLATED)
        victim = alice.submit([sys.executable, "listener.py", str(port), "40"], code=str(code), gpus_per_worker=0)
        victim_dir = server.home / "jobs" / str(victim["id"])
        wait_until(lambda: b"listening" in _log(victim_dir), 60, what="the victim to listen")
        job = mallory.submit([sys.executable, "isolated.py", str(port)], code=str(code), workers=2,
                             gpus_per_worker=0, network="isolated")
        assert job["network"] == "isolated"
        done = mallory.wait(job["id"], timeout=120)
        out = _log(server.home / "jobs" / str(job["id"])).decode()
        assert done["state"] == "succeeded", out
        tried = json.loads(out.strip().splitlines()[-1])
        assert tried == {"world": 2, "the victim's port": "ConnectionRefusedError",
                         "the host's ssh": "ConnectionRefusedError", "api": "mallory"}, tried
        alice.cancel(victim["id"])
        assert b"victim reached" not in _log(victim_dir)
        with pytest.raises(Exception) as refused:
            mallory.submit([sys.executable, "isolated.py"], code=str(code), network="bridged")
        assert getattr(refused.value, "status", None) == 422
    finally:
        server.stop()
        server.cleanup_jobs()
