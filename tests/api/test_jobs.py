"""The jobs API: submit, follow, cancel, and every kind of bad input."""

import json
import sys

import pytest
from sqlalchemy import func, select

from deeppod.store.models import Job


def body(tmp_path, **kw):
    b = {"command": [sys.executable, "-c", "print(1)"], "workdir": str(tmp_path)}
    b.update(kw)
    return b


def job_count(api) -> int:
    with api.ctx.sessions() as s:
        return s.scalar(select(func.count()).select_from(Job))


def test_submit_show_list_events_cancel(api, tmp_path):
    h = api.as_(api.admin)
    r = api.http.post("/v1/jobs", json=body(tmp_path, name="demo", workers=2, gpus_per_worker=1), headers=h)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["state"] == "queued" and job["tenant"] == "default" and job["user"] == "admin"
    assert api.http.get(f"/v1/jobs/{job['id']}", headers=h).json()["name"] == "demo"
    assert [j["id"] for j in api.http.get("/v1/jobs", headers=h).json()] == [job["id"]]
    api.ctx.reconciler.tick()
    assert api.http.get(f"/v1/jobs/{job['id']}", headers=h).json()["state"] == "running"
    r = api.http.post(f"/v1/jobs/{job['id']}/cancel", headers=h)
    assert r.status_code == 200 and r.json()["cancel_requested"]
    api.ctx.reconciler.tick()
    api.ctx.reconciler.tick()
    final = api.http.get(f"/v1/jobs/{job['id']}", headers=h).json()
    assert final["state"] == "cancelled"
    kinds = [e["kind"] for e in api.http.get(f"/v1/jobs/{job['id']}/events", headers=h).json()]
    assert kinds == ["queued", "started", "cancel-requested", "cancelled"]
    r = api.http.post(f"/v1/jobs/{job['id']}/cancel", headers=h)
    assert r.status_code == 409 and r.json()["error"]["code"] == "conflict"


BAD = [
    ("zero workers", {"workers": 0}, 422, "workers"),
    ("too many GPUs", {"workers": 5, "gpus_per_worker": 1}, 422, "whole cluster has 4"),
    ("unknown executable", {"command": ["pyhton3-typo", "x.py"]}, 422, "was not found"),
    ("missing workdir", {"workdir": "/does/not/exist"}, 422, "does not exist"),
    ("unknown field", {"wrokers": 2}, 422, "unknown field 'wrokers'"),
    ("empty command", {"command": []}, 422, "command"),
    ("wrong type", {"workers": "two"}, 422, "workers"),
    ("reserved env", {"env": {"WORLD_SIZE": "9"}}, 422, "set by DeepPod"),
]


@pytest.mark.parametrize("what,change,status,message", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_a_clear_4xx_and_writes_nothing(api, tmp_path, what, change, status, message):
    r = api.http.post("/v1/jobs", json=body(tmp_path, **change), headers=api.as_(api.admin))
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert message in err["message"] and err["code"]
    assert job_count(api) == 0


def test_malformed_json(api):
    r = api.http.post("/v1/jobs", content=b'{"command": ["x"', headers={**api.as_(api.admin),
                                                                         "content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "malformed_json"
    assert "not valid JSON" in r.json()["error"]["message"]
    assert job_count(api) == 0


def test_oversized_body_declared_and_chunked(api, tmp_path):
    big = body(tmp_path, env={"BIG": "x" * 100_000})
    r = api.http.post("/v1/jobs", json=big, headers=api.as_(api.admin))
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"

    def chunks():
        data = json.dumps(big).encode()
        for i in range(0, len(data), 8192):
            yield data[i:i + 8192]

    r = api.http.post("/v1/jobs", content=chunks(), headers={**api.as_(api.admin), "content-type": "application/json"})
    assert r.status_code == 413
    assert job_count(api) == 0


def test_logs_of_a_job_that_has_not_started_are_empty_and_bad_rank_is_explained(api, tmp_path):
    h = api.as_(api.admin)
    jid = api.http.post("/v1/jobs", json=body(tmp_path, workers=2), headers=h).json()["id"]
    r = api.http.get(f"/v1/jobs/{jid}/logs", headers=h)
    assert r.status_code == 200 and r.content == b""
    r = api.http.get(f"/v1/jobs/{jid}/logs", params={"rank": 5}, headers=h)
    assert r.status_code == 422 and "ranks 0..1" in r.json()["error"]["message"]


def test_logs_prefix_ranks_and_filter_one(api, tmp_path):
    h = api.as_(api.admin)
    jid = api.http.post("/v1/jobs", json=body(tmp_path, workers=2), headers=h).json()["id"]
    logs = api.ctx.settings.jobs_dir / str(jid) / "logs"
    logs.mkdir(parents=True)
    (logs / "rank-0.log").write_text("a\nb\n")
    (logs / "rank-1.log").write_text("c\npartial")
    text = api.http.get(f"/v1/jobs/{jid}/logs", headers=h).text
    assert sorted(text.splitlines()) == ["[rank 0] a", "[rank 0] b", "[rank 1] c", "[rank 1] partial"]
    assert api.http.get(f"/v1/jobs/{jid}/logs", params={"rank": 1}, headers=h).text == "c\npartial"


def test_openapi_and_docs(api):
    assert api.http.get("/docs").status_code == 200
    spec = api.http.get("/openapi.json").json()
    assert "/v1/jobs" in spec["paths"] and "/v1/jobs/{job_id}/logs" in spec["paths"]


def test_unknown_route_is_json(api):
    r = api.http.get("/v1/nope", headers=api.as_(api.admin))
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
