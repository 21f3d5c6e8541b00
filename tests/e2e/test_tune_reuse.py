"""A search that reuses processes on a real server with real trial processes: trial after trial
in the process the first started in, at most --parallel processes, a pruned trial ending
without its process, the best trial right; the same script without --reuse, a process each."""

import re
import sys
from pathlib import Path

import pytest

from deeppod import Client
from tests.helpers import wait_until

pytestmark = pytest.mark.slow
TRIAL = str(Path(__file__).with_name("tune_reuse_trial.py"))


def _ran(server, job_ids) -> dict[int, int]:
    """trial number -> the pid of the process that ran it, from the jobs' logs."""
    out = {}
    for job_id in job_ids:
        for log in (server.home / "jobs" / str(job_id)).rglob("*.log"):
            for number, pid in re.findall(r"^trial (\d+) pid (\d+)", log.read_text(errors="replace"), re.M):
                out[int(number)] = int(pid)
    return out


def _search(c, name, tmp_path, reuse):
    c.create_experiment(name, [sys.executable, TRIAL], workdir=str(tmp_path),
                        space={"x": {"type": "float", "low": 0.0, "high": 1.0,
                                     "env_only": True}}, metric="score", trials=8,
                        parallel=2, sampler="random", pruner="median", seed=5, reuse=reuse)
    done = wait_until(lambda: (e := c.experiment(name))["state"] not in ("running", "stopping") and e,
                      240, interval=0.5, what=f"search {name} to end")
    assert done["state"] == "completed", done["reason"]
    assert [t["number"] for t in done["trial_table"]] == list(range(8))
    return done


def test_trials_run_one_after_another_in_warm_processes(fresh_server, tmp_path):
    server = fresh_server.start()
    c = Client(server.url, server.admin_token)
    done = _search(c, "warm", tmp_path, reuse=True)
    assert done["reuse"] is True
    rows = done["trial_table"]
    jobs = {t["job_id"] for t in rows}
    assert len(jobs) <= 2  # --parallel 2: two processes ran all eight
    ran = _ran(server, jobs)
    assert sorted(ran) == list(range(8)) and len(set(ran.values())) <= 2, ran
    for job_id in jobs:
        wait_until(lambda: c.job(job_id)["state"] == "succeeded", 60, what="each process to exit when told")
    for t in rows:
        assert t["state"] in ("completed", "pruned"), t
        if t["state"] == "pruned":  # the trial stopped early; its process went on
            assert t["step"] < 9 and c.job(t["job_id"])["state"] == "succeeded"
    completed = [t for t in rows if t["state"] == "completed"]
    top = max(completed, key=lambda t: t["value"])
    assert done["best_trial"] == top["number"]
    assert top["value"] == pytest.approx(top["params"]["x"] * (1 - 2.718281828459045 ** (-10 / 3)), rel=1e-6)

    plain = _search(c, "cold", tmp_path, reuse=False)  # the same script: a process per trial
    jobs = {t["job_id"] for t in plain["trial_table"]}
    assert len(jobs) == 8 and len(set(_ran(server, jobs).values())) == 8


def test_promotion_pauses_trials_in_their_process_and_goes_on_where_they_stopped(fresh_server, tmp_path):
    server = fresh_server.start()
    c = Client(server.url, server.admin_token)
    c.create_experiment("promote", [sys.executable, TRIAL], workdir=str(tmp_path),
                        space={"x": {"type": "float", "low": 0.0, "high": 1.0, "env_only": True}}, metric="score",
                        trials=6, parallel=2, sampler="random", pruner="asha-promote", seed=5, reuse=True)
    done = wait_until(lambda: (e := c.experiment("promote"))["state"] not in ("running", "stopping") and e,
                      240, interval=0.5, what="the search to end")
    assert done["state"] == "completed", done["reason"]
    rows = {t["number"]: t for t in done["trial_table"]}
    jobs = {t["job_id"] for t in rows.values()}
    logs = "\n".join(p.read_text(errors="replace") for j in jobs
                     for p in (server.home / "jobs" / str(j)).rglob("*.log"))
    starts = [(int(n), int(pid), int(s)) for n, pid, s in re.findall(r"^trial (\d+) pid (\d+) x \S+ from step (\d+)",
                                                                       logs, re.M)]
    paused = [(int(n), int(s)) for n, s in re.findall(r"^trial (\d+) paused at step (\d+)", logs, re.M)]
    # the first to reach the first rung (step 1) waited there: it did not run past it alone
    assert (0, 1) in paused, paused
    # a promoted trial went on in the process that kept it, from the step after the one it paused at
    for number, pid, start in starts:
        if start:
            first = next(p for n, p, s in starts if n == number and s == 0)
            assert pid == first and (number, start - 1) in paused, (number, starts, paused)
    resumed = {n for n, _, s in starts if s}
    # every turn handed back ran: none was ended unrun by the word of the turn before it
    handed = {(int(n), int(s)) for j in jobs for e in c.jobs.events(j)
              for n, s in re.findall(r"^trial (\d+) .*goes on with it from step (\d+)", e["message"])}
    assert handed and handed <= {(n, s) for n, _, s in starts}, (handed, starts)
    top = max(rows.values(), key=lambda t: t["params"]["x"])
    said = {n: (t["params"]["x"], t["state"], t["step"], t.get("reason")) for n, t in rows.items()}
    assert top["number"] in resumed and top["state"] == "completed" and done["best_trial"] == top["number"], (
        said, starts, paused)
    assert [t["state"] for t in rows.values()].count("completed") == 1
    assert all(t["state"] == "pruned" for t in rows.values() if t["number"] != top["number"])
    # each trial started from step 0 once; the others were turns after a pause
    assert sorted(n for n, _, s in starts if s == 0) == list(range(6)), starts
    for job_id in jobs:
        wait_until(lambda: c.job(job_id)["state"] == "succeeded", 60, what="each process to exit when told")
