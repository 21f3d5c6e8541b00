"""Console job pages through the jobs service: the list (filter, sort, pages), a job's page
and its live parts, stop / resume / cancel, the submit and trainer forms (bad input next to
the field, never a 5xx, nothing left behind)."""

import re

import pytest

from deeppod.contract import JobState
from deeppod.store.models import Job, JobMetric, JobSample
from tests.ui.conftest import Browser, field_errors


def _submit(api, token, tmp_path, name="j", gpus=0):
    r = api.http.post("/v1/jobs", json={"command": ["python", "x.py"], "workdir": str(tmp_path), "name": name,
                                        "gpus_per_worker": gpus}, headers=api.as_(token))
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _ids(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr data-job="(\d+)">', html)]


def test_the_list_filters_sorts_and_pages_within_the_tenant(api, tmp_path):
    ana, bob = api.user("ana", "vision"), api.user("bob", "audio")
    mine = [_submit(api, ana, tmp_path, name=f"resnet-{i}") for i in range(3)]
    _submit(api, bob, tmp_path, name="resnet-secret")
    b = Browser(api, ana)
    page = b.get("/jobs").text
    assert _ids(page) == mine[::-1] and "resnet-secret" not in page
    assert _ids(b.get("/jobs?sort=id").text) == mine
    assert _ids(b.get("/jobs?name=resnet-1").text) == [mine[1]]
    assert _ids(b.get("/jobs?state=running").text) == []
    part = b.get("/jobs?sort=name", headers={"HX-Request": "true", "HX-Target": "jobs-table"}).text
    assert "<html" not in part and _ids(part) == mine  # just the table, for htmx
    admin = Browser(api, api.admin)
    assert len(_ids(admin.get("/jobs?sort=tenant").text)) == 4
    assert _ids(admin.get("/jobs?tenant=audio").text) == [mine[-1] + 1]


def test_the_list_pages_fifty_at_a_time(api, tmp_path):
    with api.ctx.sessions.begin() as s:
        s.add_all(Job(name=f"j{i}", tenant_id=1, user_id=1, command=["x"], workdir=str(tmp_path)) for i in range(120))
    b = Browser(api, api.admin)
    first, third = b.get("/jobs").text, b.get("/jobs?page=3").text
    assert len(_ids(first)) == 50 and _ids(first)[0] == 120 and "page 1 of 3" in first
    assert _ids(third) == list(range(20, 0, -1))


@pytest.mark.parametrize("path", ["/jobs?sort=bogus", "/jobs?page=abc", "/jobs?state=sleeping", "/jobs?kind=cron",
                                  "/jobs/99999999999999999999", "/jobs/0", "/jobs/1/log?rank=-1",
                                  "/jobs/abc", "/cluster/gpus.json?hours=lots"])
def test_bad_addresses_get_a_page_that_says_what_to_fix(api, path, tmp_path):
    _submit(api, api.admin, tmp_path)
    r = Browser(api, api.admin).get(path)
    assert 400 <= r.status_code < 500 and "text/html" in r.headers["content-type"], (r.status_code, r.text[:300])
    assert re.search(r'role="alert">[^<]{10,}', r.text)


def test_a_job_page_and_its_live_parts(api, tmp_path):
    job = _submit(api, api.admin, tmp_path, name="digits")
    points = [{"step": s, "metrics": {"loss": 1.0 / (s + 1), "val_accuracy": s / 5000}} for s in range(5000)]
    points[0]["histograms"] = {"weights/fc": {"min": -1.0, "max": 1.0, "counts": [1, 5, 1]}}
    for at in range(0, len(points), 500):  # the test server's body limit is 64 KiB
        r = api.http.post(f"/v1/jobs/{job}/metrics", json={"points": points[at:at + 500]}, headers=api.as_(api.admin))
        assert r.status_code == 202, r.text
    b = Browser(api, api.admin)
    page = b.get(f"/jobs/{job}").text
    assert "Job 1: digits" in page and 'id="stop"' in page and "DeepPod.jobCharts(1)" in page
    data = b.get(f"/jobs/{job}/metrics.json?max_points=500").json()
    assert set(data["metrics"]) == {"loss", "val_accuracy"} and not data["final"]
    assert len(data["metrics"]["loss"]["series"]) <= 500 and data["metrics"]["loss"]["last"] == [4999, 1 / 5000]
    assert b.get(f"/jobs/{job}/metrics.json?max_points=999999").json()["metrics"]["loss"]["points"] == 5000
    assert b.get(f"/jobs/{job}/histograms.json").json()[0]["counts"] == [1, 5, 1]
    (api.ctx.settings.jobs_dir / str(job) / "logs").mkdir(parents=True)
    (api.ctx.settings.jobs_dir / str(job) / "logs" / "rank-0.log").write_text("".join(f"line {i}\n" for i in 
                                                                                     range(10000)))
    log = b.get(f"/jobs/{job}/log?rank=0").text
    assert "line 9999" in log and "line 0\n" not in log and len(log) < 20_000  # the tail, whole lines
    assert "queued" in b.get(f"/jobs/{job}/events").text


def test_a_job_pages_resources_come_from_the_monitors_samples_and_only_to_its_tenant(api, tmp_path):
    job = _submit(api, api.admin, tmp_path)
    with api.ctx.sessions.begin() as s:
        s.add_all([JobSample(job_id=job, at=100.0, cpu_seconds=3.0, memory_mb=700.0),
                   JobSample(job_id=job, at=105.0, cpu_seconds=8.0, memory_mb=710.0)])
    b = Browser(api, api.admin)
    assert "DeepPod.usageCharts(1)" in b.get(f"/jobs/{job}").text
    u = b.get(f"/jobs/{job}/usage.json").json()
    assert u["cpu"] == [[105.0, 1.0]] and u["memory_mb"] == [[100.0, 700.0], [105.0, 710.0]] and not u["final"]
    assert api.http.get(f"/v1/jobs/{job}/usage", headers=api.as_(api.admin)).json()["cpu"] == [[105.0, 1.0]]
    other = api.user("carl", "audio")  # another tenant's
    assert Browser(api, other).get(f"/jobs/{job}/usage.json").status_code == 404
    assert api.http.get(f"/v1/jobs/{job}/usage", headers=api.as_(other)).status_code == 404


def test_stop_resume_and_cancel_from_the_page(api, tmp_path):
    job = _submit(api, api.admin, tmp_path)
    b = Browser(api, api.admin)
    with api.ctx.sessions.begin() as s:
        s.get(Job, job).state = JobState.STOPPED
    part = b.post(f"/jobs/{job}/resume", headers={"HX-Request": "true"}).text
    assert 'id="job-state">queued' in part and 'id="cancel"' in part
    assert 'id="job-state">cancelled' in b.post(f"/jobs/{job}/cancel").text
    r = b.post(f"/jobs/{job}/resume", headers={"HX-Request": "true"})
    assert r.status_code == 409 and r.text.startswith('<p class="error"')  # htmx shows it in place
    assert b.post(f"/jobs/{job}/explode").status_code == 422


def test_a_queued_job_that_can_never_start_says_so_on_its_page(api, tmp_path):
    """The console's submit form leads to the job's page: the submit answer's warning is there too."""
    held = _submit(api, api.admin, tmp_path, "replica-like", gpus=3)
    with api.ctx.sessions.begin() as s:
        s.get(Job, held).preemptible = False
    api.ctx.jobs.tick()
    job = _submit(api, api.admin, tmp_path, "too-big", gpus=2)
    b = Browser(api, api.admin)
    page = b.get(f"/jobs/{job}").text
    assert 'id="job-warning"' in page and "can never start as asked" in page and "3 of 4 GPUs" in page
    assert 'id="job-warning"' not in b.get(f"/jobs/{held}").text  # running: nothing to warn of
    fits = _submit(api, api.admin, tmp_path, "fits", gpus=1)
    assert 'id="job-warning"' not in b.get(f"/jobs/{fits}/status").text


def test_a_jobs_page_shows_its_spec_and_downloads_it(api, tmp_path):
    """Issue 71: the console shows a job as the file that submits it again."""
    job = _submit(api, api.admin, tmp_path, name="digits")
    b = Browser(api, api.admin)
    page = b.get(f"/jobs/{job}").text
    assert 'id="job-spec"' in page and "name: digits" in page and f'href="/jobs/{job}/spec.yaml?download=1"' in page
    r = b.get(f"/jobs/{job}/spec.yaml?download=1")
    assert r.status_code == 200 and r.headers["content-disposition"] == f'attachment; filename="job-{job}.yaml"'
    assert "command: [python, x.py]\n" in r.text and f"workdir: {tmp_path}" in r.text
    assert Browser(api, api.user("carl", "audio")).get(f"/jobs/{job}/spec.yaml").status_code == 404
    with api.ctx.sessions.begin() as s:
        s.get(Job, job).kind = "trial"  # a search's trial: made by the search, nothing to submit again
    assert 'id="job-spec"' not in b.get(f"/jobs/{job}").text


def test_another_users_job_cannot_be_changed(api, tmp_path):
    ana, ben = api.user("ana", "vision"), api.user("ben", "vision")
    job = _submit(api, ana, tmp_path)
    b = Browser(api, ben)
    assert b.get(f"/jobs/{job}").status_code == 200  # same tenant: seen
    r = b.post(f"/jobs/{job}/cancel")
    assert r.status_code == 403 and "another user" in r.text
    other = Browser(api, api.user("carl", "audio"))
    assert other.get(f"/jobs/{job}").status_code == 404  # another tenant's: as if it did not exist
    assert other.get(f"/jobs/{job}/log").status_code == 404
    assert other.get(f"/jobs/{job}/events").status_code == 404


def test_submit_with_the_defaults_a_user_gets(api, tmp_path):
    b = Browser(api, api.admin)
    r = b.post("/jobs/new", {"command": "python train.py --lr 0.1", "env": "A=1\nB = two\n", "workers": "1:3"})
    assert r.status_code == 303, field_errors(r.text) or r.text[:500]
    job = api.http.get(r.headers["location"].replace("/jobs/", "/v1/jobs/"), headers=api.as_(api.admin)).json()
    assert job["command"] == ["python", "train.py", "--lr", "0.1"] and job["workers"] == 1 and job["max_workers"] == 3
    assert job["gpus_per_worker"] == 1  # the cluster has (logical) GPUs: as the API and CLI decide
    assert set(job["env"]) == {"A", "B"} and job["workdir"].endswith("/code")


def test_a_time_limit_from_the_form_reaches_the_job_and_its_page(api):
    b = Browser(api, api.admin)
    r = b.post("/jobs/new", {"command": "python x.py", "time": "1-12:00:00"})
    assert r.status_code == 303, field_errors(r.text) or r.text[:500]
    job = api.http.get(r.headers["location"].replace("/jobs/", "/v1/jobs/"), headers=api.as_(api.admin)).json()
    assert job["time_limit_seconds"] == 129600
    assert re.search(r'id="job-time-limit"[^>]*>36h a run<', b.get(r.headers["location"]).text)


BAD_SUBMITS = [
    ({"command": ""}, "command", "give the command"),
    ({"command": "python 'x.py"}, "command", "quotes"),
    ({"command": "python x.py", "workers": "two"}, "workers", "number of workers"),
    ({"command": "python x.py", "workers": "4:2"}, "workers", "fewer than the least"),
    ({"command": "python x.py", "workers": "0"}, "workers", "greater than or equal to 1"),
    ({"command": "python x.py", "gpus_per_worker": "-1"}, "gpus_per_worker", "greater than or equal to 0"),
    ({"command": "python x.py", "gpus_per_worker": "1.5"}, "gpus_per_worker", "whole number"),
    ({"command": "python x.py", "cpus_per_worker": "lots"}, "cpus_per_worker", "not a number"),
    ({"command": "python x.py", "env": "JUSTANAME"}, "env", "NAME=VALUE"),
    ({"command": "python x.py", "datasets": "nosuch"}, "datasets", "no such dataset"),
    ({"command": "python x.py", "workdir": "relative/dir"}, "workdir", ""),
    ({"command": "python x.py", "priority": "99999"}, "priority", "less than or equal to 1000"),
    ({"command": "python x.py", "name": "x" * 200}, "name", "at most 128"),
    ({"command": "python x.py", "gpu_memory_mb": "0"}, "gpu_memory_mb", "greater than or equal to 1"),
    ({"command": "python x.py", "gpus_per_worker": "0", "gpu_memory_mb": "4096"}, "gpu_memory_mb", "for no GPU"),
    ({"command": "python x.py", "time": "90"}, "time", "'90' is not a time limit: use e.g. 90m"),
    ({"command": "python x.py", "time": "400d"}, "time", "less than or equal to 31536000"),
]


@pytest.mark.parametrize("form,field,says", BAD_SUBMITS)
def test_bad_submissions_are_refused_next_to_the_field_and_leave_nothing(api, form, field, says):
    b = Browser(api, api.admin)
    r = b.post("/jobs/new", form)
    assert r.status_code == (404 if "dataset" in says else 422), r.text[:500]  # as the API answers
    errors = field_errors(r.text)
    assert field in errors and says in errors[field].replace("&#39;", "'"), errors
    for k, v in form.items():  # what the user typed is kept
        if v and k != "env":
            assert f'value="{v}"'.replace("'", "&#39;") in r.text, k
    assert api.http.get("/v1/jobs", headers=api.as_(api.admin)).json() == []
    assert not list(api.ctx.settings.jobs_dir.glob("*/code")) if api.ctx.settings.jobs_dir.exists() else True


def test_a_refused_submission_at_the_service_is_shown_and_rolled_back(api):
    b = Browser(api, api.admin)
    r = b.post("/jobs/new", {"command": "python x.py", "gpus_per_worker": "64"})
    assert r.status_code == 422 and field_errors(r.text).get("gpus_per_worker"), r.text[:800]
    assert api.http.get("/v1/jobs", headers=api.as_(api.admin)).json() == []


BAD_TRAINS = [
    ({}, "dataset", "choose the dataset"),
    ({"dataset": "digits", "epochs": "ten"}, "epochs", "whole number"),
    ({"dataset": "digits", "lr": "fast"}, "lr", "not a number"),
    ({"dataset": "digits", "model": "resnet9000"}, "model", "not a model the trainer knows"),
    ({"dataset": "digits", "optimizer": "telepathy"}, "optimizer", "invalid choice"),
    ({"dataset": "nosuch"}, "dataset", "no such dataset"),
]


@pytest.mark.parametrize("form,field,says", BAD_TRAINS)
def test_the_trainer_form_refuses_bad_input_next_to_the_field(api, form, field, says):
    b = Browser(api, api.admin)
    r = b.post("/jobs/new/trainer", {"model": "small-cnn", "optimizer": "momentum", **form})
    assert r.status_code == (404 if "no such" in says else 422)
    errors = field_errors(r.text)
    assert field in errors and says in errors[field].replace("&#39;", "'"), errors
    assert api.http.get("/v1/jobs", headers=api.as_(api.admin)).json() == []


def test_metric_series_are_downsampled_for_the_page(api, tmp_path):
    job = _submit(api, api.admin, tmp_path)
    with api.ctx.sessions.begin() as s:
        s.add_all(JobMetric(job_id=job, name="loss", step=i, value=float(i)) for i in range(100_000))
    data = Browser(api, api.admin).get(f"/jobs/{job}/metrics.json").json()["metrics"]["loss"]
    assert data["points"] == 100_000 and len(data["series"]) <= 1000 and data["series"][-1] == [99999, 99999.0]


def test_a_running_jobs_page_shows_its_warm_spares(api, tmp_path):
    job = _submit(api, api.admin, tmp_path, name="elastic")
    with api.ctx.sessions.begin() as s:
        j = s.get(Job, job)
        j.state, j.max_workers = JobState.RUNNING, 4
        j.allocation = {"workers": [{"rank": 0, "node": "n1", "gpus": [], "cpus": 1, "memory_mb": 0}], "spares": 2}
    page = Browser(api, api.admin).get(f"/jobs/{job}/status").text
    assert re.search(r'id="job-spares"[^>]*>2 on n1, ready to join', page), page
    with api.ctx.sessions.begin() as s:
        s.get(Job, job).allocation = {"workers": [{"rank": 0, "node": "n1", "gpus": [], "cpus": 1, "memory_mb": 0}]}
    assert "job-spares" not in Browser(api, api.admin).get(f"/jobs/{job}/status").text


def test_the_trainer_form_asks_for_gpus_that_hold_its_estimate_or_refuses_next_to_the_model(api, tmp_path):
    """As `deeppod train` does (tests/e2e/test_gpu_memory.py): on GPUs that say their memory
    (here 1 GiB each) the way that fits and the estimate as the job's request; a model no GPU
    holds, even sharded and offloaded, is refused with every way's estimate above the form."""
    from deeppod.cluster.gpus import FakeProbe, GpuInfo
    from deeppod.cluster.inventory import local_node
    from deeppod.cluster.service import register_node
    from tests.datasets.images import class_folders
    from tests.datasets.test_datasets import upload

    upload(api, "pets", class_folders(tmp_path / "src"))
    with api.ctx.sessions.begin() as s:
        register_node(s, local_node(FakeProbe([GpuInfo(i, f"GPU-{i}", "1 GiB GPU", 1024, False) for i in range(4)]),
                                    cpus=8, memory_mb=16384))
    b = Browser(api, api.admin)
    form = {"dataset": "pets", "optimizer": "adam", "workers": "2", "epochs": "1"}
    r = b.post("/jobs/new/trainer", {**form, "model": "resnet152", "image_size": "224", "batch_size": "64"})
    assert r.status_code == 422
    said = re.search(r'id="form-error">([^<]*)<', r.text).group(1).replace("&#39;", "'")
    assert "resnet152 does not fit in 1,024 MiB per GPU" in said and "offload at 2 workers" in said, said
    assert api.http.get("/v1/jobs", headers=api.as_(api.admin)).json() == []
    r = b.post("/jobs/new/trainer", {**form, "model": "resnet50", "image_size": "32", "batch_size": "16"})
    assert r.status_code == 303, r.text
    job = api.http.get("/v1/jobs", headers=api.as_(api.admin)).json()[0]
    assert 600 < job["gpu_memory_mb"] <= 1024 and "--strategy fsdp" in " ".join(job["command"])


def test_runs_side_by_side_overlay_each_metric_with_step_and_time(api, tmp_path):
    b = Browser(api, api.admin)
    jobs = [_submit(api, api.admin, tmp_path, name=f"run-{k}") for k in range(2)]
    for k, job in enumerate(jobs):
        points = [{"step": s, "metrics": {"loss": (k + 1) / (s + 1), **({"val_accuracy": s / 10} if k else {})}}
                  for s in range(10)]
        assert api.http.post(f"/v1/jobs/{job}/metrics", json={"points": points},
                             headers=api.as_(api.admin)).status_code == 202
    assert f'class="pick" value="{jobs[0]}"' in b.get("/jobs").text and 'id="compare-link"' in b.get("/jobs").text
    page = b.get(f"/jobs/compare?ids={jobs[0]},{jobs[1]}")
    assert page.status_code == 200 and all(f'data-job="{j}"' in page.text for j in jobs)
    data = b.get(f"/jobs/compare.json?ids={jobs[0]}, {jobs[1]}").json()
    assert [j["id"] for j in data["jobs"]] == jobs and set(data["metrics"]) == {"loss", "val_accuracy"}
    loss = data["metrics"]["loss"]
    assert set(loss) == {str(j) for j in jobs} and set(data["metrics"]["val_accuracy"]) == {str(jobs[1])}
    for series in loss.values():
        steps, times = [p[0] for p in series], [p[2] for p in series]
        assert steps == list(range(10)) and times[0] == 0 and times == sorted(times)  # seconds since its first
    assert loss[str(jobs[1])][-1][1] == 2 / 10
    # what to fix, and nothing of another tenant's
    assert b.get("/jobs/compare?ids=1,x").status_code == 422
    assert "at most 10" in b.get("/jobs/compare?ids=" + ",".join(map(str, range(1, 13)))).text
    ana = Browser(api, api.user("ana", "vision"))
    assert ana.get(f"/jobs/compare?ids={jobs[0]}").status_code == 404
    assert ana.get(f"/jobs/compare.json?ids={jobs[0]}").status_code == 404
    assert 'id="compare-none"' in b.get("/jobs/compare").text  # none picked: how to pick them
