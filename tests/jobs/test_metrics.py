"""Training metrics through the API: ingest with the job's token, downsampled series,
histograms, stop rules that stop the job gracefully, and `stop`."""

import sys

import pytest

from deeppod.executor.fake import FakeExecutor


def submit(api, tmp_path, token, **kw):
    body = {"command": [sys.executable, "-c", "1"], "workdir": str(tmp_path), **kw}
    r = api.http.post("/v1/jobs", json=body, headers=api.as_(token))
    assert r.status_code == 201, r.text
    return r.json()["id"]


def post(api, token, job_id, points):
    return api.http.post(f"/v1/jobs/{job_id}/metrics", json={"points": points}, headers=api.as_(token))


def test_ingest_read_downsample_histograms(api, tmp_path):
    jid = submit(api, tmp_path, api.admin)
    pts = [{"step": s, "metrics": {"loss": 1.0 / (s + 1), "acc": s / 1000}} for s in range(1000)]
    pts.append({"step": 1000, "histograms": {"weights/fc": {"min": -1.0, "max": 1.0, "counts": [1, 2, 3]}}})
    r = post(api, api.admin, jid, pts)
    assert r.status_code == 202 and r.json()["stored"] == 2001
    m = api.http.get(f"/v1/jobs/{jid}/metrics", params={"max_points": 50}, headers=api.as_(api.admin)).json()
    loss = m["metrics"]["loss"]
    assert loss["points"] == 1000 and len(loss["series"]) <= 51 and loss["last"] == [999, pytest.approx(0.001)]
    assert loss["series"][0][1] > loss["series"][-2][1]  # bucket means keep the shape
    only = api.http.get(f"/v1/jobs/{jid}/metrics", params={"names": "acc"}, headers=api.as_(api.admin)).json()
    assert set(only["metrics"]) == {"acc"}
    h = api.http.get(f"/v1/jobs/{jid}/histograms", headers=api.as_(api.admin)).json()
    assert h == [{"name": "weights/fc", "step": 1000, "min": -1.0, "max": 1.0, "counts": [1, 2, 3]}]


def test_bad_points_are_refused_and_nothing_is_stored(api, tmp_path):
    jid = submit(api, tmp_path, api.admin)
    for bad in ([{"step": -1, "metrics": {"x": 1}}], [{"step": 1, "metrics": {"x": "high"}}],
                [{"step": 1, "histograms": {"h": {"counts": "no"}}}], [{"stp": 1}]):
        r = post(api, api.admin, jid, bad)
        assert 400 <= r.status_code < 500, (bad, r.text)
    assert api.http.get(f"/v1/jobs/{jid}/metrics", headers=api.as_(api.admin)).json()["metrics"] == {}


def test_other_tenants_cannot_write_or_read_metrics(api, tmp_path):
    alice = api.user("alice", "a")
    bob = api.user("bob", "b")
    jid = submit(api, tmp_path, alice)
    assert post(api, bob, jid, [{"step": 1, "metrics": {"x": 1}}]).status_code == 404
    assert api.http.get(f"/v1/jobs/{jid}/metrics", headers=api.as_(bob)).status_code == 404  # as if missing
    assert post(api, alice, jid, [{"step": 1, "metrics": {"x": 1}}]).status_code == 202


def run(api, jid):
    api.ctx.jobs.tick()
    j = api.http.get(f"/v1/jobs/{jid}", headers=api.as_(api.admin)).json()
    assert j["state"] == "running"


def test_nan_rule_stops_the_job_gracefully(api, tmp_path):
    jid = submit(api, tmp_path, api.admin, stop_rules=[{"kind": "nan", "metric": "loss"}])
    run(api, jid)
    post(api, api.admin, jid, [{"step": 1, "metrics": {"loss": 2.0}}, {"step": 2, "metrics": {"loss": "nan"}}])
    api.ctx.jobs.tick()
    assert jid in api.ctx.executor.terminated  # SIGTERM: the job checkpoints
    api.ctx.jobs.tick()
    j = api.http.get(f"/v1/jobs/{jid}", headers=api.as_(api.admin)).json()
    assert j["state"] == "stopped" and "loss became NaN" in j["reason"]


def test_plateau_rule(api, tmp_path):
    rule = {"kind": "plateau", "metric": "val_loss", "patience": 3, "mode": "min"}
    jid = submit(api, tmp_path, api.admin, stop_rules=[rule])
    run(api, jid)
    post(api, api.admin, jid, [{"step": s, "metrics": {"val_loss": v}} for s, v in enumerate([1.0, 0.8, 0.7, 0.75])])
    api.ctx.jobs.tick()
    assert jid not in api.ctx.executor.terminated
    post(api, api.admin, jid, [{"step": 4, "metrics": {"val_loss": 0.71}}, {"step": 5, "metrics": {"val_loss": 0.9}}])
    api.ctx.jobs.tick()
    api.ctx.jobs.tick()
    j = api.http.get(f"/v1/jobs/{jid}", headers=api.as_(api.admin)).json()
    assert j["state"] == "stopped" and "not improved for 3 reports" in j["reason"]


def test_bad_stop_rules_are_refused(api, tmp_path):
    r = api.http.post("/v1/jobs", json={"command": [sys.executable], "workdir": str(tmp_path),
                                        "stop_rules": [{"kind": "plateau", "metric": "x", "patience": 0}]},
                      headers=api.as_(api.admin))
    assert r.status_code == 422 and "patience" in r.json()["error"]["message"]


def test_stop_command_and_exit_75_requeues(api, tmp_path):
    jid = submit(api, tmp_path, api.admin)
    run(api, jid)
    r = api.http.post(f"/v1/jobs/{jid}/stop", headers=api.as_(api.admin))
    assert r.status_code == 200 and r.json()["stop_reason"].startswith("stopped by admin")
    api.ctx.jobs.tick()
    api.ctx.jobs.tick()
    assert api.http.get(f"/v1/jobs/{jid}", headers=api.as_(api.admin)).json()["state"] == "stopped"
    # a job that exits 75 on its own (it checkpointed and asks to be resumed) is requeued, not failed
    other = submit(api, tmp_path, api.admin, workers=2)
    run(api, other)
    ex: FakeExecutor = api.ctx.executor
    ex.finish(other, {0: 75, 1: 75})
    api.ctx.jobs.tick()
    j = api.http.get(f"/v1/jobs/{other}", headers=api.as_(api.admin)).json()
    assert j["restart_count"] == 1 and j["state"] in ("queued", "running")


def test_resume_a_stopped_job_with_the_same_id(api, tmp_path):
    jid = submit(api, tmp_path, api.admin)
    run(api, jid)
    r = api.http.post(f"/v1/jobs/{jid}/resume", headers=api.as_(api.admin))
    assert r.status_code == 409 and "only a stopped job" in r.json()["error"]["message"]
    api.http.post(f"/v1/jobs/{jid}/stop", headers=api.as_(api.admin))
    api.ctx.jobs.tick()
    api.ctx.jobs.tick()
    r = api.http.post(f"/v1/jobs/{jid}/resume", headers=api.as_(api.admin))
    assert r.status_code == 200 and r.json()["state"] == "queued" and r.json()["stop_reason"] is None
    api.ctx.jobs.tick()
    j = api.http.get(f"/v1/jobs/{jid}", headers=api.as_(api.admin)).json()
    assert j["id"] == jid and j["state"] == "running"
    kinds = [e["kind"] for e in api.http.get(f"/v1/jobs/{jid}/events", headers=api.as_(api.admin)).json()]
    assert kinds[-3:] == ["stopped", "resumed", "started"]


def test_plateau_rule_on_a_long_run(api, tmp_path):
    """Thousands of reports: the rule looks at the last `patience` ones and the best before them."""
    rule = {"kind": "plateau", "metric": "loss", "patience": 50, "mode": "min"}
    jid = submit(api, tmp_path, api.admin, stop_rules=[rule])
    run(api, jid)
    falling = [{"step": s, "metrics": {"loss": 10.0 / (s + 1)}} for s in range(3000)]
    for i in range(0, 3000, 1000):
        assert post(api, api.admin, jid, falling[i:i + 1000]).status_code == 202
    api.ctx.jobs.tick()
    assert jid not in api.ctx.executor.terminated  # still improving
    flat = [{"step": 3000 + s, "metrics": {"loss": 0.5}} for s in range(50)]
    post(api, api.admin, jid, flat)
    api.ctx.jobs.tick()
    assert jid in api.ctx.executor.terminated


def test_a_resumed_run_replaces_the_steps_it_reports_again(api, tmp_path):
    """A job that restarted from its checkpoint at step 2 reports steps 3.. again: one timeline,
    the last run's value at each step, nothing from the lost steps after it."""
    jid = submit(api, tmp_path, api.admin)
    assert post(api, api.admin, jid, [{"step": s, "metrics": {"loss": 10.0 - s}} for s in range(1,
                                                                                                6)]).status_code == 202
    assert post(api, api.admin, jid, [{"step": s, "metrics": {"loss": 100.0 + s}} for s in (3, 4)]).status_code == 202
    loss = api.http.get(f"/v1/jobs/{jid}/metrics", headers=api.as_(api.admin)).json()["metrics"]["loss"]
    assert loss["series"] == [[1, 9.0], [2, 8.0], [3, 103.0], [4, 104.0]]
    assert loss["points"] == 4 and loss["last"] == [4, 104.0]
    steps = [s for s, _ in loss["series"]]
    assert steps == sorted(set(steps))
