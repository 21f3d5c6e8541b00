"""Bursting end to end on Ray's own autoscaler with its fake multi-node provider (the real
autoscaler; its nodes are local processes): a real `deeppod server --executor ray` whose own
cluster is one 1-GPU node. A queue of a tenant that may burst gets burst nodes, its jobs run
there, the nodes leave after idling, and their cost is recorded and shown; a tenant that may
not burst never lands on one; a burst type whose nodes fail to start is reported on the jobs
waiting for it."""

import re
import sys

import pytest

from deeppod import Client
from tests.helpers import LiveServer, wait_until

pytest.importorskip("ray")
pytestmark = pytest.mark.slow

HOLD = """
import os, time
while not os.path.exists("release"):
    time.sleep(0.2)
print("released", flush=True)
"""

# vision's two jobs run together (each waits for the other to start), so they need two nodes
# however fast a job ends and however slowly a node starts: on a slow machine the second cloud
# node joined after the first job had ended, and the second job rightly took the free one
TOGETHER = """
import os, sys, time
open(f"started-{sys.argv[1]}", "w").close()
deadline = time.time() + 180
while sum(name.startswith("started-") for name in os.listdir(".")) < 2 and time.time() < deadline:
    time.sleep(0.2)
print("vision ran", flush=True)
"""

PLAN = {
    "tenants": [{"name": "vision", "burst_budget": 100.0}, {"name": "robotics"}, {"name": "nlp", "guaranteed": 1}],
    "burst": [
        # 36 an hour: 0.01 a second, so a few seconds of a node cost a visible amount
        {"name": "cloud", "gpus": 1, "max_nodes": 2, "cost_per_hour": 36.0, "tenants": ["vision"],
         "wait_minutes": 0, "idle_minutes": 0.1, "start_minutes": 2},
        {"name": "broken", "gpus": 1, "max_nodes": 1, "cost_per_hour": 1.0, "tenants": ["robotics"],
         "wait_minutes": 0, "start_minutes": 0.05},
    ],
}


@pytest.fixture(scope="module")
def cluster():
    from deeppod.bench.ray_cluster import LocalRayCluster

    c = LocalRayCluster(burst_types={
        "cloud": {"CPU": 2, "GPU": 1, "deeppod-burst-cloud": 1, "max_workers": 2},
        # an object store smaller than Ray accepts: every launch of this type fails, and is retried
        "broken": {"CPU": 1, "GPU": 1, "object_store_memory": 1000, "deeppod-burst-broken": 1, "max_workers": 1},
    })
    try:
        c.add_node()  # the cluster's own GPU node
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def server(cluster, tmp_path_factory):
    s = LiveServer(tmp_path_factory.mktemp("burst") / "home", extra_env={
        "DEEPPOD_EXECUTOR": "ray", "DEEPPOD_RAY_ADDRESS": cluster.address, **cluster.client_env}).start()
    yield s
    s.stop()
    s.cleanup_jobs()


def _nodes(admin: Client) -> dict[str, dict]:
    return {n["name"]: n for n in admin.nodes()}


def test_a_queue_bursts_onto_cloud_nodes_that_leave_when_idle(server, tmp_path):
    admin = Client(server.url, server.admin_token)
    users = {}
    for t in ("vision", "robotics", "nlp"):
        admin.create_tenant(t)
        users[t] = Client(server.url, admin.create_user(f"user-{t}", t)["token"])
    admin.apply_plan(PLAN)
    (tmp_path / "hold.py").write_text(HOLD)
    (tmp_path / "together.py").write_text(TOGETHER)
    nlp, vision, robotics = users["nlp"], users["vision"], users["robotics"]

    holder = nlp.submit([sys.executable, "hold.py"], name="holder", gpus_per_worker=1, workdir=str(tmp_path))
    wait_until(lambda: nlp.job(holder["id"])["state"] == "running", 60, what="nlp's job on the own node")
    own = nlp.job(holder["id"])["allocation"]["workers"][0]["node"]
    assert _nodes(admin)[own]["burst"] is None
    blocked = nlp.submit([sys.executable, "-c", "print('nlp ran')"], name="nlp-waits", gpus_per_worker=1,
                         workdir=str(tmp_path))
    runs = [vision.submit([sys.executable, "together.py", str(i)], name=f"vision-{i}", gpus_per_worker=1,
                          workdir=str(tmp_path)) for i in range(2)]
    stuck = robotics.submit([sys.executable, "-c", "print('never')"], name="robotics", gpus_per_worker=1,
                            workdir=str(tmp_path))

    # vision's queue bursts: two cloud nodes join and its jobs run there
    done = [vision.wait(j["id"], 240) for j in runs]
    assert [d["state"] for d in done] == ["succeeded", "succeeded"], done
    nodes = _nodes(admin)
    placed = {d["allocation"]["workers"][0]["node"] for d in done}
    assert len(placed) == 2 and all(nodes[n]["burst"] == "cloud" for n in placed), (placed, nodes)
    reasons = " ".join(e["message"] for d in done for e in vision.events(d["id"]))
    assert "burst node" in reasons and "on burst nodes of type cloud" in reasons

    # nlp may not burst: its job waits for the own node while cloud nodes are up and idle
    assert nlp.job(blocked["id"])["state"] == "queued"
    assert not any("burst" in e["message"] for e in nlp.events(blocked["id"]))

    # the broken type's nodes never join: the job waiting for them says so, with the autoscaler's word
    # the autoscaler's word is read every few seconds (cluster/burst.NOTES_S), so it can follow "have not joined"
    wait_until(lambda: all(w in robotics.job(stuck["id"])["reason"] for w in ("have not joined",
                                                                              "the autoscaler says")),
               60, what="the robotics job to report burst nodes that did not join, with the autoscaler's word")
    why = robotics.job(stuck["id"])["reason"]
    assert "broken" in why and "the autoscaler says" in why and "keeps trying" in why, why

    # idle cloud nodes leave: DeepPod stops asking after idle_minutes, the autoscaler lets them go
    wait_until(lambda: all(not _nodes(admin)[n]["up"] for n in placed), 120, what="the idle burst nodes to leave")
    status = admin.burst()
    cloud = next(t for t in status["types"] if t["name"] == "cloud")
    assert cloud["nodes_up"] == 0 and cloud["nodes_asked"] == 0
    (charge,) = [c for c in status["charges"] if c["tenant"] == "vision"]
    assert charge["node_type"] == "cloud" and charge["nodes"] == 2
    # each node up for its job and its idle minutes (6 s), at 0.01 a second
    assert charge["seconds"] >= 2 * 6 and abs(charge["cost"] - charge["seconds"] * 0.01) < 1e-6, charge
    assert not [c for c in status["charges"] if c["tenant"] == "nlp"]
    assert {"tenant": "vision", "budget": 100.0, "spent": round(charge["cost"], 4)} in status["budgets"]
    exported = re.search(r'deeppod_burst_cost_total\{node_type="cloud",tenant="vision"\} (\S+)', _metrics(server))
    assert exported and float(exported[1]) == pytest.approx(charge["cost"], abs=0.05)
    shown = server.cli(tmp_path, "nodes").stdout
    assert "BURST TYPE" in shown and "cloud" in shown and "vision" in shown, shown

    # a tenant's own view: its charges only
    assert [c["tenant"] for c in vision.burst()["charges"]] == ["vision"]
    assert nlp.burst()["charges"] == []

    # the own node frees: nlp's job runs there, never on a burst node
    (tmp_path / "release").write_text("")
    assert nlp.wait(holder["id"], 60)["state"] == "succeeded"
    ran = nlp.wait(blocked["id"], 60)
    assert ran["state"] == "succeeded" and _nodes(admin)[ran["allocation"]["workers"][0]["node"]]["burst"] is None
    robotics.cancel(stuck["id"])


def _metrics(server) -> str:
    import httpx

    r = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {server.admin_token}"}, timeout=30)
    r.raise_for_status()
    return r.text
