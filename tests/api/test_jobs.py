"""The jobs API: submit, follow, cancel, and every kind of bad input."""

import json
import os
import sys
from pathlib import Path

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
    api.ctx.jobs.tick()
    assert api.http.get(f"/v1/jobs/{job['id']}", headers=h).json()["state"] == "running"
    r = api.http.post(f"/v1/jobs/{job['id']}/cancel", headers=h)
    assert r.status_code == 200 and r.json()["cancel_requested"]
    api.ctx.jobs.tick()
    api.ctx.jobs.tick()
    final = api.http.get(f"/v1/jobs/{job['id']}", headers=h).json()
    assert final["state"] == "cancelled"
    kinds = [e["kind"] for e in api.http.get(f"/v1/jobs/{job['id']}/events", headers=h).json()]
    assert kinds == ["queued", "started", "cancel-requested", "cancelled"]
    r = api.http.post(f"/v1/jobs/{job['id']}/cancel", headers=h)
    assert r.status_code == 409 and r.json()["error"]["code"] == "conflict"


def test_submit_warns_of_a_job_that_can_never_start_beside_what_is_never_preempted(api, tmp_path):
    """Issue 71: with a replica holding room for good, a job that needs it waited in silence."""
    h = api.as_(api.admin)
    held = api.http.post("/v1/jobs", json=body(tmp_path, gpus_per_worker=3, preemptible=False), headers=h).json()
    assert held["warning"] is None
    api.ctx.jobs.tick()
    assert api.http.get(f"/v1/jobs/{held['id']}", headers=h).json()["state"] == "running"
    r = api.http.post("/v1/jobs", json=body(tmp_path, workers=2, gpus_per_worker=1), headers=h)
    assert r.status_code == 201 and r.json()["state"] == "queued"
    assert "can never start as asked: 2 workers x (1 GPUs" in r.json()["warning"]
    assert "3 of 4 GPUs" in r.json()["warning"] and "only 1 such worker fits" in r.json()["warning"]
    assert api.http.get(f"/v1/jobs/{r.json()['id']}", headers=h).json()["warning"] is None  # the submit answer's
    # one that fits beside it, or a preemptible holder: no warning
    assert api.http.post("/v1/jobs", json=body(tmp_path, gpus_per_worker=1), headers=h).json()["warning"] is None


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


# -- defaults a new user gets ----------------------------------------------------------

@pytest.fixture
def small_gpu_box(tmp_path):
    """The new user's machine: 2 cores, 4 GPU slots."""
    from fastapi.testclient import TestClient

    from deeppod.cluster.gpus import LogicalProbe
    from deeppod.executor.fake import FakeExecutor
    from deeppod.server import bootstrap_admin, build, http_app
    from deeppod.settings import Settings
    from tests.conftest import Api

    ctx = build(Settings(home=tmp_path / "home", cpus=2, memory_mb=8192, isolation="single-user"),
                executor=FakeExecutor(), probe=LogicalProbe(4))
    admin = bootstrap_admin(ctx)
    with TestClient(http_app(ctx)) as http:
        yield Api(ctx, http, admin)
    ctx.engine.dispose()


def test_jobs_default_to_one_gpu_and_a_cpu_share_that_leaves_no_gpu_idle(small_gpu_box, tmp_path):
    api, h = small_gpu_box, small_gpu_box.as_(small_gpu_box.admin)
    ids = [api.http.post("/v1/jobs", json=body(tmp_path), headers=h).json()["id"] for _ in range(5)]
    first = api.http.get(f"/v1/jobs/{ids[0]}", headers=h).json()
    assert first["gpus_per_worker"] == 1 and first["cpus_per_worker"] == 0.5
    api.ctx.jobs.tick()
    states = [api.http.get(f"/v1/jobs/{i}", headers=h).json() for i in ids]
    assert [j["state"] for j in states] == ["running"] * 4 + ["queued"]  # every GPU used
    assert states[4]["reason"].startswith("waiting for 1 GPUs (0 free)")
    nodes = api.http.get("/v1/nodes", headers=h).json()
    assert [(n["gpus_used"], n["gpus_free"], n["cpus_used"], n["workers"]) for n in nodes] == [(4, 0, 2.0, 4)]


def test_explicit_cpu_requests_that_exhaust_the_cores_are_named_in_the_reason(small_gpu_box, tmp_path):
    api, h = small_gpu_box, small_gpu_box.as_(small_gpu_box.admin)
    ids = [api.http.post("/v1/jobs", json=body(tmp_path, cpus_per_worker=1), headers=h).json()["id"]
           for _ in range(3)]
    api.ctx.jobs.tick()
    third = api.http.get(f"/v1/jobs/{ids[2]}", headers=h).json()
    assert third["state"] == "queued" and third["reason"].startswith("not enough free CPUs")


def test_zero_gpus_stays_possible_and_a_cpu_worker_asks_for_one_cpu(small_gpu_box, tmp_path):
    api, h = small_gpu_box, small_gpu_box.as_(small_gpu_box.admin)
    job = api.http.post("/v1/jobs", json=body(tmp_path, gpus_per_worker=0), headers=h).json()
    assert job["gpus_per_worker"] == 0 and job["cpus_per_worker"] == 1.0


def test_a_cluster_without_gpus_defaults_to_cpu_workers(tmp_path):
    from deeppod.job_spec import JobSpec
    from deeppod.jobs.service import with_defaults

    cap = {"gpus": 0, "cpus_per_gpu": None}
    req = with_defaults(JobSpec(command=["x"], workdir="/"), cap)
    assert (req.gpus_per_worker, req.cpus_per_worker) == (0, 1.0)
    req = with_defaults(JobSpec(command=["x"], workdir="/", gpus_per_worker=2), {"gpus": 8, "cpus_per_gpu": 8.0})
    assert (req.gpus_per_worker, req.cpus_per_worker) == (2, 16.0)


def test_remove_a_finished_jobs_files_then_its_logs_say_so(api, tmp_path):
    h = api.as_(api.admin)
    job = api.http.post("/v1/jobs", json=body(tmp_path), headers=h).json()
    r = api.http.delete(f"/v1/jobs/{job['id']}/files", headers=h)
    assert r.status_code == 409 and "cancel it first" in r.json()["error"]["message"]
    api.http.post(f"/v1/jobs/{job['id']}/cancel", headers=h)  # queued: ends at once
    folder = api.ctx.settings.jobs_dir / str(job["id"])
    folder.mkdir(parents=True)
    (folder / "rank-0.log").write_text("hello\n")
    r = api.http.delete(f"/v1/jobs/{job['id']}/files", headers=h)
    assert r.status_code == 200 and r.json() == {"jobs": [job["id"]], "bytes_freed": 6}
    assert not folder.exists() and api.http.get(f"/v1/jobs/{job['id']}", headers=h).json()["purged_at"]
    r = api.http.get(f"/v1/jobs/{job['id']}/logs", headers=h)
    assert r.status_code == 409 and "were removed" in r.json()["error"]["message"]
    r = api.http.post("/v1/jobs/purge", json={"older_than_seconds": 0}, headers=h)
    assert r.status_code == 200 and r.json()["jobs"] == []
    r = api.http.post("/v1/jobs/purge", json={"older_than_seconds": -1}, headers=h)
    assert r.status_code == 422


def test_env_values_are_write_only(api, tmp_path):
    import sys

    ana = api.user("ana", "vision")
    r = api.http.post("/v1/jobs", json={"command": [sys.executable, "-c", "1"], "workdir": str(tmp_path),
                                        "env": {"AWS_SECRET_ACCESS_KEY": "hunter2"}}, headers=api.as_(ana))
    assert r.status_code == 201 and r.json()["env"] == {"AWS_SECRET_ACCESS_KEY": "***"}
    assert "hunter2" not in api.http.get(f"/v1/jobs/{r.json()['id']}", headers=api.as_(ana)).text
    api.ctx.jobs.tick()
    assert api.ctx.executor.launched[r.json()["id"]].workers[0].env["AWS_SECRET_ACCESS_KEY"] == "hunter2"
    assert (api.ctx.settings.home / "secret.key").stat().st_mode & 0o777 == 0o600


def test_code_sent_with_a_job_becomes_its_own_workdir(api, tmp_path):
    from deeppod.sdk.code import pack

    src = tmp_path / "proj"
    src.mkdir()
    (src / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(src / "run.sh", 0o755)
    packed = pack(src)
    ana = api.as_(api.user("ana", "vision"))
    put = lambda h: api.http.put(f"/v1/code/{packed.digest}", content=packed.data, headers=h)  # noqa: E731
    r = put(ana)
    assert r.status_code == 200 and r.json() == {"digest": packed.digest, "bytes": len(packed.data), "files": 1}
    assert put(ana).status_code == 200  # again: nothing changes
    # a relative command is found in the code it came with
    r = api.http.post("/v1/jobs", json={"command": ["./run.sh"], "code": packed.digest}, headers=ana)
    assert r.status_code == 201, r.text
    workdir = Path(r.json()["workdir"])
    assert workdir == api.ctx.settings.jobs_dir / str(r.json()["id"]) / "code"
    assert (workdir / "run.sh").read_text().startswith("#!/bin/sh")
    assert not list(api.ctx.settings.jobs_dir.glob(".code-*"))  # nothing staged is left behind
    # another tenant that knows the digest gets nothing
    bo = api.as_(api.user("bo", "speech"))
    r = api.http.post("/v1/jobs", json={"command": ["./run.sh"], "code": packed.digest}, headers=bo)
    assert r.status_code == 404 and "PUT /v1/code/" in r.json()["error"]["message"]
    # neither workdir nor code: an empty folder of its own
    r = api.http.post("/v1/jobs", json={"command": [sys.executable, "-c", "1"]}, headers=ana)
    assert r.status_code == 201 and list(Path(r.json()["workdir"]).iterdir()) == []


@pytest.mark.parametrize("what,body,status,message", [
    ("both", {"workdir": "/tmp", "code": "a" * 64}, 422, "not both"),
    ("bad digest", {"code": "xyz"}, 422, "code"),
    ("unknown code", {"code": "b" * 64}, 404, "PUT /v1/code/"),
    ("a script the code lacks", {"command": ["./missing.sh"]}, 422, "<the job's folder>/./missing.sh"),
])
def test_bad_code_requests_write_nothing(api, what, body, status, message):
    r = api.http.post("/v1/jobs", json={"command": [sys.executable, "-c", "1"], **body},
                      headers=api.as_(api.admin))
    assert r.status_code == status and message in r.text, r.text
    assert job_count(api) == 0
    assert not list(api.ctx.settings.jobs_dir.glob(".code-*")) and not list(api.ctx.settings.jobs_dir.glob("*/code"))


def test_code_uploads_are_checked(api):
    h = api.as_(api.admin)
    r = api.http.put("/v1/code/" + "c" * 64, content=b"junk", headers=h)
    assert r.status_code == 422 and "SHA-256" in r.json()["error"]["message"]
    assert api.http.put("/v1/code/not-a-digest", content=b"junk", headers=h).status_code == 422
    assert api.http.put("/v1/code/" + "c" * 64, content=b"", headers=h).status_code == 422
    viewer = api.as_(api.user("vi", "default", role="viewer"))
    assert api.http.put("/v1/code/" + "c" * 64, content=b"junk", headers=viewer).status_code == 403


def test_a_member_cannot_pick_a_pids_limit_above_the_servers(api, tmp_path):
    """Issue 70: --pids-per-worker 4194304 from a plain member was accepted where the plan named
    no cap; it is a 403 that says the cap, and nothing is written."""
    member = api.user("mo", "red")
    before = job_count(api)
    r = api.http.post("/v1/jobs", json=body(tmp_path, pids_per_worker=4194304), headers=api.as_(member))
    assert r.status_code == 403 and r.json()["error"]["code"] == "over_limit", r.text
    assert f"at most {api.ctx.settings.pids_per_worker} processes and threads" in r.json()["error"]["message"]
    assert job_count(api) == before
    ok = api.http.post("/v1/jobs", json=body(tmp_path, pids_per_worker=256), headers=api.as_(member))
    assert ok.status_code == 201, ok.text


def test_a_member_cannot_ask_for_more_memory_cpus_or_gpu_memory_than_its_plan_allows(api, tmp_path):
    """Issue 70: the plan's caps on what one worker asks; a 403 names the cap and writes nothing."""
    member = api.user("mo", "red")
    r = api.http.put("/v1/plan", json={"tenants": [{"name": "red", "guaranteed": 0, "memory_gb_per_worker": 1,
                                                    "cpus_per_worker": 1}]}, headers=api.as_(api.admin))
    assert r.status_code == 200, r.text
    assert r.json()["plan"]["tenants"][0]["memory_gb_per_worker"] == 1
    before = job_count(api)
    for ask, words in (({"memory_mb_per_worker": 2048}, ("at most 1 GiB of memory per worker", "memory_gb_per_worker")),
                       ({"cpus_per_worker": 2}, ("at most 1 CPUs per worker", "raise cpus_per_worker"))):
        r = api.http.post("/v1/jobs", json=body(tmp_path, **ask), headers=api.as_(member))
        assert r.status_code == 403 and r.json()["error"]["code"] == "over_limit", r.text
        assert all(w in r.json()["error"]["message"] for w in words), r.text
    assert job_count(api) == before
    ok = api.http.post("/v1/jobs", json=body(tmp_path, memory_mb_per_worker=1024), headers=api.as_(member))
    assert ok.status_code == 201, ok.text


def test_a_jobs_spec_gives_its_options_back_without_env_values(api, tmp_path):
    """Issue 71: a run is reproduced from the file its job writes (deeppod submit --spec)."""
    h = api.as_(api.admin)
    job = api.http.post("/v1/jobs", json=body(tmp_path, name="demo", workers=2, max_workers=3, gpus_per_worker=1,
                                              memory_mb_per_worker=2048, env={"API_KEY": "zz-secret"},
                                              requirements="numpy==2.1\n", priority=2), headers=h).json()
    r = api.http.get(f"/v1/jobs/{job['id']}/spec", headers=h)
    assert r.status_code == 200, r.text
    fields = r.json()["fields"]
    assert fields["command"] == job["command"] and fields["workers"] == "2:3" and fields["memory"] == "2G"
    assert fields["workdir"] == str(tmp_path) and fields["requirements"] == ["numpy==2.1"] and fields["priority"] == 2
    assert "zz-secret" not in r.text and "-e API_KEY=..." in r.json()["yaml"]
    with api.ctx.sessions.begin() as s:  # a deployment's replica is not made by submit: no spec to submit again
        s.get(Job, job["id"]).kind = "serve"
    r = api.http.get(f"/v1/jobs/{job['id']}/spec", headers=h)
    assert r.status_code == 422 and "made by the platform" in r.json()["error"]["message"]


def test_a_job_reads_registered_models_pinned_at_submit(api, tmp_path):
    from tests.models.hf_folder import write_tiny_llama

    h = api.as_(api.admin)
    folder = write_tiny_llama(tmp_path / "tiny")
    for _ in range(2):
        assert api.http.post("/v1/models/llama-tiny/versions", json={"path": str(folder), "aliases": ["base"]},
                             headers=h).status_code == 201
    r = api.http.post("/v1/jobs", json=body(tmp_path, models=["llama-tiny@base"]), headers=h)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["models"] == [{"ref": "llama-tiny@2", "version_id": job["models"][0]["version_id"],
                              "env": "DEEPPOD_MODEL_LLAMA_TINY"}]  # the alias, pinned; no server path shown
    with api.ctx.sessions() as s:
        row = s.get(Job, job["id"])
        path = row.models[0]["path"]
        assert path.endswith("default/llama-tiny/v2") and path in row.read_paths  # bound read-only
    # a model that is not there, or named twice, or another tenant's: refused, nothing made
    before = job_count(api)
    r = api.http.post("/v1/jobs", json=body(tmp_path, models=["nosuch"]), headers=h)
    assert r.status_code == 404 and "no model 'nosuch'" in r.text
    r = api.http.post("/v1/jobs", json=body(tmp_path, models=["llama-tiny@1", "llama-tiny@2"]), headers=h)
    assert r.status_code == 422 and "two models called 'llama-tiny'" in r.text
    ana = api.user("ana", "vision")
    r = api.http.post("/v1/jobs", json=body(tmp_path, models=["llama-tiny"]), headers=api.as_(ana))
    assert r.status_code in (403, 404) and "llama-tiny" in r.text
    assert job_count(api) == before
