"""The console's search pages: the list, one search's trials with parameters and values, the
data its charts draw (best so far, every trial's curve, parameters against the value), links
between a trial's job and its search, and nothing of another tenant's."""

import sys

from sqlalchemy import select

from deeppod.store.models import Job
from tests.ui.conftest import Browser

SPACE = {"lr": {"type": "float", "low": 0.001, "high": 0.1, "log": True},
         "opt": {"type": "categorical", "choices": ["sgd", "adam"]}}


def _search(api, tmp_path, token, name="lr-search"):
    r = api.http.post("/v1/experiments", headers=api.as_(token), json={
        "name": name, "metric": "val_acc", "mode": "max", "trials": 3, "parallel": 3, "sampler": "random",
        "pruner": "none", "seed": 3, "space": SPACE,
        "job": {"command": [sys.executable, "-c", "pass", "{lr}", "{opt}"], "workdir": str(tmp_path),
                "gpus_per_worker": 1}})
    assert r.status_code == 201, r.text
    ctx, done = api.ctx, set()
    for _ in range(40):  # the server's two loops, one round at a time; each trial reports 3 epochs and ends
        ctx.jobs.tick()
        ctx.experiments.tick()
        with ctx.sessions() as s:
            running = [j.id for j in s.scalars(select(Job).where(Job.kind == "trial", Job.state == "running"))]
        for job_id in running:
            if job_id in done or job_id not in ctx.executor.launched:
                continue
            points = [{"step": k, "metrics": {"val_acc": 0.1 * job_id + 0.2 * k, "loss": 1.0 / (k + 1)}}
                      for k in range(3)]
            assert api.http.post(f"/v1/jobs/{job_id}/metrics", headers=api.as_(token),
                                 json={"points": points}).status_code == 202
            ctx.executor.finish(job_id, {0: 0})
            done.add(job_id)
        r = api.http.get(f"/v1/experiments/{name}", headers=api.as_(token)).json()
        if r["state"] == "completed":
            return r
    raise AssertionError(f"search still {r['state']}: {r}")


def test_a_search_page_shows_its_trials_and_the_data_of_its_charts(api, tmp_path):
    exp = _search(api, tmp_path, api.admin)
    b = Browser(api, api.admin)
    listed = b.get("/experiments").text
    assert 'data-experiment="lr-search"' in listed and "3 of 3" in listed and 'href="/experiments"' in listed
    page = b.get("/experiments/lr-search?tenant=default")
    assert page.status_code == 200
    for t in exp["trial_table"]:
        assert f'data-trial="{t["number"]}"' in page.text and f'href="/jobs/{t["job_id"]}"' in page.text
    assert "<th>lr</th><th>opt</th><th>val_acc</th>" in page.text and 'id="exp-best"' in page.text
    d = b.get("/experiments/lr-search/data.json?tenant=default").json()
    assert d["state"] == "completed" and d["space"] == SPACE and len(d["trials"]) == 3
    assert {t["params"]["opt"] for t in d["trials"]} <= {"sgd", "adam"}
    values = {t["number"]: t["value"] for t in d["trials"]}
    assert set(d["curves"]) == {str(n) for n in values}
    for number, curve in d["curves"].items():
        assert [p[0] for p in curve] == [0, 1, 2] and curve[-1][1] == values[int(number)]  # its last report
    best = [p[1] for p in d["best_so_far"]]
    assert best == sorted(best) and best[-1] == max(values.values()) == exp["best_value"]  # only ever better
    # the trial's job page leads back to its search
    job_page = b.get(f"/jobs/{exp['trial_table'][0]['job_id']}").text
    assert 'id="job-search"' in job_page and 'href="/experiments/lr-search?tenant=default"' in job_page


def test_another_tenants_search_is_not_shown(api, tmp_path):
    _search(api, tmp_path, api.admin, name="secret-search")
    ana = Browser(api, api.user("ana", "vision"))
    assert "secret-search" not in ana.get("/experiments").text
    assert ana.get("/experiments/secret-search").status_code == 404
    assert ana.get("/experiments/secret-search?tenant=default").status_code == 403
    assert ana.get("/experiments/secret-search/data.json?tenant=default").status_code == 403
