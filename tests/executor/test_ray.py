"""The Ray executor on a real multi-node Ray cluster on this machine (ray.cluster_utils): a
head with no GPUs and worker nodes with one (logical) GPU each, a real `deeppod server
--executor ray` against it. A 2-worker DDP job lands on two nodes and all-reduces; killing a
node under a running job requeues it to resume from its checkpoint on the nodes left."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from deeppod import Client
from tests.helpers import LiveServer, wait_until  # noqa: F401

from deeppod.contract import free_port

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow

DDP = """
import os, socket, time, torch, torch.distributed as dist
ckpt = os.path.join(os.environ["DEEPPOD_CHECKPOINT_DIR"], "step.txt")
step = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
print(f"rank {os.environ['RANK']} starts at step {step}", flush=True)
dist.init_process_group("gloo")
steps = int(os.environ.get("STEPS", "1"))
while step < steps:
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    assert t.item() == 3.0, t.item()
    step += 1
    if dist.get_rank() == 0:
        open(ckpt + ".tmp", "w").write(str(step)); os.replace(ckpt + ".tmp", ckpt)
    time.sleep(float(os.environ.get("STEP_S", "0")))
print(f"rank {dist.get_rank()} all-reduced {t.item()} through step {step}", flush=True)
dist.destroy_process_group()
"""


class RayCluster:
    """A real Ray cluster on this machine, started as an administrator would (`ray start`):
    a head without GPUs and worker raylets with one GPU each, all under one temp folder so
    that exactly our processes are stopped at the end."""

    def __init__(self):
        self.temp = Path(tempfile.mkdtemp(prefix="dpray", dir="/tmp"))  # unix sockets below: keep it short
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        self._ray("--head", "--port", str(self.port), "--num-cpus", "1", "--num-gpus", "0",
                  "--temp-dir", str(self.temp), "--include-dashboard", "false")

    def _ray(self, *args: str) -> None:
        ray_cli = str(Path(sys.executable).with_name("ray"))
        p = subprocess.run([ray_cli, "start", "--node-ip-address", "127.0.0.1", *args], env=self.env,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr

    def add_node(self) -> None:
        self._ray("--address", self.address, "--num-cpus", "2", "--num-gpus", "1")

    def pids(self, marker: str | None = None) -> list[int]:
        """Our Ray processes (those of one node: ``marker`` in their arguments), by PID."""
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    args = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                if str(self.temp) in args and (marker is None or marker in args):
                    found.append(int(entry))
        return found

    def kill_node(self, node_id_prefix: str) -> None:
        """The node dies as a machine would: its raylet and everything under it, SIGKILL."""
        raylets = self.pids(f"--node_id={node_id_prefix}")
        assert raylets, f"no raylet of node {node_id_prefix}"
        victims = set(raylets)
        for entry in os.listdir("/proc"):  # the raylet's children: its workers, our node agent
            if entry.isdigit():
                try:
                    ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                if ppid in raylets:
                    victims.add(int(entry))
        for pid in victims:
            os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.temp, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    c = RayCluster()
    try:
        for _ in range(3):
            c.add_node()
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def server(cluster, tmp_path_factory):
    s = LiveServer(tmp_path_factory.mktemp("ray") / "home", extra_env={
        "DEEPPOD_EXECUTOR": "ray", "DEEPPOD_RAY_ADDRESS": cluster.address}).start()
    yield s
    s.stop()
    s.cleanup_jobs()


def _job(c: Client, steps: int, step_s: float) -> dict:
    return c.submit([sys.executable, "ddp.py"], workers=2, env={"STEPS": str(steps), "STEP_S": str(step_s)},
                    max_restarts=0)


def test_nodes_are_rays_and_a_two_node_ddp_job_all_reduces(server, cluster, tmp_path, monkeypatch):
    c = Client(server.url, server.admin_token)
    nodes = c.nodes()
    assert len(nodes) == 4 and sum(len(n["gpus"]) for n in nodes) == 3 and all(n["up"] for n in nodes)
    (tmp_path / "ddp.py").write_text(DDP)
    monkeypatch.chdir(tmp_path)
    job = _job(c, steps=3, step_s=0)
    done = c.wait(job["id"], timeout=180)
    assert done["state"] == "succeeded", (done, _logs(server, job["id"]))
    placed = {w["node"] for w in done["allocation"]["workers"]}
    assert len(placed) == 2, done  # one GPU per node: two nodes
    out = "".join((server.home / "jobs" / str(job["id"]) / "logs" / f"rank-{r}.log").read_text() for r in (0, 1))
    assert out.count("all-reduced 3.0 through step 3") == 2, out


def _logs(server, job_id) -> str:
    folder = server.home / "jobs" / str(job_id)
    return "\n".join(f"{p.name}: {p.read_text()}" for p in sorted(folder.glob("**/*.log")))


def test_a_node_that_dies_under_a_job_requeues_it_to_resume_on_the_nodes_left(server, cluster, tmp_path,
                                                                               monkeypatch):
    c = Client(server.url, server.admin_token)
    (tmp_path / "ddp.py").write_text(DDP)
    monkeypatch.chdir(tmp_path)
    job = _job(c, steps=40, step_s=0.25)  # 10 s of steps, a checkpoint at each
    ckpt = server.home / "jobs" / str(job["id"]) / "checkpoints" / "step.txt"
    wait_until(lambda: ckpt.exists() and int(ckpt.read_text() or 0) >= 4, 120, what="a few steps")
    first = c.job(job["id"])
    placed = [w["node"] for w in first["allocation"]["workers"]]
    doomed = placed[1]
    cluster.kill_node(doomed.rsplit("-", 1)[1])
    wait_until(lambda: not {n["name"]: n for n in c.nodes()}[doomed]["up"], 60, what="the node marked down")
    done = c.wait(job["id"], timeout=240)
    assert done["state"] == "succeeded", (done["reason"], c.events(job["id"]), _logs(server, job["id"]))
    assert done["id"] == job["id"] and done["restart_count"] == 1
    again = {w["node"] for w in done["allocation"]["workers"]}
    assert doomed not in again and len(again) == 2
    events = [(e["kind"], e["message"]) for e in c.events(job["id"])]
    assert any("was lost" in m for _, m in events), events
    out = (server.home / "jobs" / str(job["id"]) / "logs" / "rank-0.log").read_text()
    resumed = [int(line.split("starts at step ")[1]) for line in out.splitlines() if "starts at step" in line]
    assert resumed[0] == 0 and resumed[-1] >= 4, out  # lost at most one checkpoint interval
    assert "all-reduced 3.0 through step 40" in out
