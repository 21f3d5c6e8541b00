"""The monitoring API: /metrics in Prometheus' format (parsed by prometheus-client's own
parser), admins only; GPU samples per job, another tenant's hidden."""

import sys

from prometheus_client.parser import text_string_to_metric_families

from deeppod.cluster.readings import FakeGpuSampler, FakeHostSampler, OneNode
from deeppod.monitor.loop import Monitor


def test_metrics_and_gpu_samples(api, tmp_path):
    alice = api.user("alice", "a")
    bob = api.user("bob", "b")
    job = api.http.post("/v1/jobs", json={"command": [sys.executable, "-c", "pass"], "workdir": str(tmp_path),
                                          "workers": 2, "gpus_per_worker": 1}, headers=api.as_(alice)).json()
    api.http.post("/v1/jobs", json={"command": [sys.executable, "-c", "pass"], "workdir": str(tmp_path),
                                    "workers": 8}, headers=api.as_(bob))  # waits: alice holds 2 of the 8 CPUs
    api.ctx.jobs.tick()
    gpus = FakeGpuSampler(4)
    for i in range(4):
        gpus.set(i, util=25.0 * i, power_w=100.0 + i, temperature_c=50.0)
    mon = Monitor(api.ctx.sessions, OneNode(api.ctx.node.name, gpus, FakeHostSampler()))
    mon.tick()
    r = api.http.get("/metrics", headers=api.as_(api.admin))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    fams = {f.name: f for f in text_string_to_metric_families(r.text)}
    jobs = {(s.labels["state"], s.labels["tenant"]): s.value for s in fams["deeppod_jobs"].samples}
    assert jobs[("running", "a")] == 1
    assert {s.labels["tenant"]: s.value for s in fams["deeppod_tenant_gpus_allocated"].samples}["a"] == 2
    util = {s.labels["gpu"]: (s.value, s.labels["job"]) for s in fams["deeppod_gpu_utilization_percent"].samples}
    assert util["3"][0] == 75.0 and sum(1 for v in util.values() if v[1] == str(job["id"])) == 2
    assert "deeppod_scheduler_round_milliseconds" in fams and "deeppod_queue_length" in fams
    latency = fams["deeppod_api_request_seconds"]
    assert any(s.labels.get("route") == "/v1/jobs" and s.labels["method"] == "POST" for s in latency.samples)
    assert {s.labels["node"] for s in fams["deeppod_gpu_samples"].samples} == {api.ctx.node.name}

    assert api.http.get("/metrics", headers=api.as_(alice)).status_code == 403
    mine = api.http.get(f"/v1/jobs/{job['id']}/gpus", headers=api.as_(alice)).json()
    assert len(mine["gpus"]) == 2 and mine["mean_util_5m"] is not None
    assert api.http.get(f"/v1/jobs/{job['id']}/gpus", headers=api.as_(bob)).status_code == 404  # as if missing
    seen = api.http.get("/v1/monitor/gpus", headers=api.as_(bob)).json()
    assert len(seen) == 4 and {g["job_id"] for g in seen} == {None} and sum(g["busy"] for g in seen) == 2
    hosts = api.http.get("/v1/monitor/hosts", headers=api.as_(bob)).json()
    assert hosts and hosts[0]["cpu_percent"] == 10.0
