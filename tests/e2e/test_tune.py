"""A search on a real server with real trial processes: trials pruned (their GPUs back at
once), the server killed with kill -9 mid-search and restarted, the search completing with
its budget exactly and the right best trial; the CLI's table."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deeppod import Client
from tests.helpers import wait_until

pytestmark = pytest.mark.slow
TRIAL = str(Path(__file__).with_name("tune_trial.py"))


def test_a_search_prunes_survives_a_server_restart_and_finds_the_best(fresh_server, tmp_path):
    server = fresh_server.start()
    c = Client(server.url, server.admin_token)
    exp = c.create_experiment("xsearch", [sys.executable, TRIAL, "--x", "{x}"], workdir=str(tmp_path),
                              space={"x": {"type": "float", "low": 0.0, "high": 1.0}}, metric="score",
                              trials=8, parallel=3, sampler="random", pruner="median", seed=7)
    assert exp["state"] == "running" and len(exp["trial_table"]) == 1  # the first trial is submitted at once
    wait_until(lambda: len(c.experiment("xsearch")["trial_table"]) >= 4, 60, what="four trials")
    server.kill9()
    server.start()
    c = Client(server.url, server.admin_token)
    done = wait_until(lambda: (e := c.experiment("xsearch"))["state"] not in ("running", "stopping") and e,
                      240, interval=1, what="the search to end")
    assert done["state"] == "completed", done["reason"]
    rows = done["trial_table"]
    assert [t["number"] for t in rows] == list(range(8))
    pruned = [t for t in rows if t["state"] == "pruned"]
    completed = [t for t in rows if t["state"] == "completed"]
    assert pruned and completed, [(t["state"], t["params"]) for t in rows]
    for t in pruned:
        job = c.job(t["job_id"])
        assert job["state"] == "pruned" and "pruned by median" in job["reason"]
    assert min(t["step"] for t in pruned) < 11  # stopped early, not at its end
    top = max(completed, key=lambda t: t["value"])
    assert done["best_trial"] == top["number"] and done["best_params"] == top["params"]
    assert all(t["params"]["x"] <= top["params"]["x"] for t in rows if t["state"] != "failed")
    assert not [j for j in c.jobs() if j["state"] in ("running", "preempted", "resizing")]  # every GPU back
    env = {**os.environ, "DEEPPOD_API_URL": server.url, "DEEPPOD_TOKEN": server.admin_token}
    out = subprocess.run([sys.executable, "-m", "deeppod.cli", "tune", "show", "xsearch"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pruned" in out.stdout and f"best: trial {top['number']}" in out.stdout and "STEPS" in out.stdout
    top = subprocess.run([sys.executable, "-m", "deeppod.cli", "top", "--once"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert top.returncode == 0 and "hosts" in top.stdout and "tenants" in top.stdout, top.stderr
    assert server.home.name in top.stdout or "%" in top.stdout  # the server samples its host
    bad = subprocess.run([sys.executable, "-m", "deeppod.cli", "tune", "create", "bad", "--space", "/dev/null",
                          "--", sys.executable, TRIAL], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "must hold a mapping of parameters" in bad.stderr
