"""The reconcile loop with the fake executor: state transitions, resources, tokens."""


import pytest
from sqlalchemy import select

from deeppod.auth import service as auth
from deeppod.errors import Unauthenticated
from deeppod.executor.base import ExecStatus
from deeppod.executor.fake import FakeExecutor
from deeppod.jobs import service
from deeppod.jobs.controller import JobController
from deeppod.scheduler import Config
from deeppod.scheduler.phases import HANDED_OFF
from deeppod.store.models import Job, JobEvent
from tests.fixtures import load_job, populate, submit_job


@pytest.fixture
def world(sessions):
    return populate(sessions)


@pytest.fixture
def rec(sessions, tmp_path):
    return JobController(sessions, FakeExecutor(), jobs_dir=tmp_path / "jobs", api_url="http://127.0.0.1:1",
                      server_env={"PATH": "/usr/bin", "DEEPPOD_DATABASE_URL": "secret"})


submit = submit_job
job = load_job


def test_queued_running_succeeded(sessions, world, rec, tmp_path):
    jid = submit(sessions, world.alice, tmp_path, workers=2, gpus_per_worker=1, env={"X": "1"})
    rec.tick()
    j = job(sessions, jid)
    assert j.state == "running" and j.started_at is not None
    spec = rec.executor.launched[jid]
    envs = [w.env for w in spec.workers]
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert {e["CUDA_VISIBLE_DEVICES"] for e in envs} == {"0", "1"}
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
    assert envs[0]["X"] == "1" and "DEEPPOD_DATABASE_URL" not in envs[0]
    assert [w.node_cpus for w in spec.workers] == [8, 8]  # what the node offers: the supervisor compares its cores
    token = envs[0]["DEEPPOD_TOKEN"]
    with sessions() as s:
        assert auth.authenticate(s, token).user == "alice"  # the job acts as its owner
    rec.executor.finish(jid, {0: 0, 1: 0})
    rec.tick()
    j = job(sessions, jid)
    assert j.state == "succeeded" and j.exit_codes == {"0": 0, "1": 0} and j.ended_at is not None
    with sessions() as s, pytest.raises(Unauthenticated):
        auth.authenticate(s, token)  # revoked when the job ended


def test_one_failed_worker_fails_the_job_with_its_reason(sessions, world, rec, tmp_path):
    jid = submit(sessions, world.alice, tmp_path, workers=2)
    rec.tick()
    rec.executor.finish(jid, {0: -15, 1: 3}, reason="rank 1 exited with code 3")
    rec.tick()
    j = job(sessions, jid)
    assert j.state == "failed" and j.reason == "rank 1 exited with code 3"


def test_gpus_are_not_given_twice_and_waiting_jobs_start_when_freed(sessions, world, rec, tmp_path):
    first = submit(sessions, world.alice, tmp_path, workers=3, gpus_per_worker=1)
    second = submit(sessions, world.bob, tmp_path, workers=2, gpus_per_worker=1)
    rec.tick()
    assert job(sessions, first).state == "running"
    assert job(sessions, second).state == "queued"
    rec.executor.finish(first, {0: 0, 1: 0, 2: 0})
    rec.tick()
    assert job(sessions, first).state == "succeeded"
    assert job(sessions, second).state == "running"


def test_cancel_running_terminates_then_records_cancelled(sessions, world, rec, tmp_path):
    jid = submit(sessions, world.alice, tmp_path)
    rec.tick()
    with sessions.begin() as s:
        service.cancel(s, world.alice, jid)
    rec.tick()  # sends terminate
    assert jid in rec.executor.terminated
    rec.tick()  # observes the end
    j = job(sessions, jid)
    assert j.state == "cancelled"
    with sessions() as s:
        kinds = [e.kind for e in service.list_events(s, world.alice, jid)]
    assert kinds == ["queued", "started", "cancel-requested", "cancelled"]


def test_launch_failure_marks_failed_and_frees_resources(sessions, world, rec, tmp_path):
    from deeppod.errors import ExecutorError

    def boom(spec):
        raise ExecutorError("no fork for you")

    rec.executor.launch = boom
    jid = submit(sessions, world.alice, tmp_path, gpus_per_worker=4)
    rec.tick()
    j = job(sessions, jid)
    assert j.state == "failed" and "no fork for you" in j.reason
    with sessions() as s:
        assert s.scalars(select(Job).where(Job.state == "running")).all() == []


def test_a_job_started_just_before_its_server_died_keeps_a_token_the_restarted_server_knows(
        sessions, world, rec, tmp_path):
    launch = rec.executor.launch

    def launch_then_die(spec):
        launch(spec)  # the job's processes run on, with the token in their environment
        raise SystemExit("killed -9")  # the server is gone: nothing after this commits

    rec.executor.launch = launch_then_die
    jid = submit(sessions, world.alice, tmp_path)
    with pytest.raises(SystemExit):
        rec.tick()
    token = rec.executor.launched[jid].workers[0].env["DEEPPOD_TOKEN"]
    assert job(sessions, jid).handle is None  # the launch's own transaction never committed
    with sessions() as s:
        assert auth.authenticate(s, token).user == "alice"  # its metrics are let in (not a 401)
    restarted = JobController(sessions, rec.executor, jobs_dir=tmp_path / "jobs", api_url="http://127.0.0.1:1",
                              server_env={"PATH": "/usr/bin"})
    rec.executor.finish(jid, {0: 0})
    restarted.tick()  # it finds the job by its folder and records its end
    assert job(sessions, jid).state == "succeeded"
    with sessions() as s, pytest.raises(Unauthenticated):
        auth.authenticate(s, token)  # revoked when the job ended


def test_a_job_decided_on_just_before_its_server_died_starts_again_not_failed(sessions, world, rec, tmp_path):
    launch = rec.executor.launch

    def die_before_launching(spec):
        raise SystemExit("killed -9")  # between the decision's commit and the launch: nothing started

    rec.executor.launch = die_before_launching
    jid = submit(sessions, world.alice, tmp_path)
    with pytest.raises(SystemExit):
        rec.tick()
    j = job(sessions, jid)
    assert j.state == "running" and j.handle is None and jid not in rec.executor.launched
    rec.executor.launch = launch
    restarted = JobController(sessions, rec.executor, jobs_dir=tmp_path / "jobs", api_url="http://127.0.0.1:1",
                              server_env={"PATH": "/usr/bin"})
    restarted.tick()  # not "the supervisor died": it was never launched, so it goes back to wait, and starts
    j = job(sessions, jid)
    assert j.state == "running" and j.handle is not None and jid in rec.executor.launched and j.restart_count == 0
    assert rec.executor.launched[jid].run  # the run it is, for the next restart to find
    with sessions() as s:
        events = [(e.kind, e.message) for e in
                  s.scalars(select(JobEvent).where(JobEvent.job_id == jid).order_by(JobEvent.id))]
    kinds = [k for k, _ in events]
    assert "failed" not in kinds and kinds.count("requeued") == 1 and kinds[-1] == "started", events
    assert "before it launched it; nothing of it ran" in dict(events)["requeued"]


def test_a_restarted_server_adopts_a_launched_run_and_not_an_earlier_one(sessions, world, rec, tmp_path):
    from deeppod.jobs.runs import run_mark

    jid = submit(sessions, world.alice, tmp_path)
    rec.tick()
    j = job(sessions, jid)
    run = run_mark(j)
    assert rec.executor.launched[jid].run == run and rec.executor.find(jid, tmp_path, run) is not None
    assert rec.executor.find(jid, tmp_path, "an earlier run") is None


def _stop_with_checkpoint(sessions, world, rec, tmp_path, write):
    """Run a job, stop it gracefully, let ``write(folder)`` act as the job on the way out."""
    jid = submit(sessions, world.alice, tmp_path, workers=1, gpus_per_worker=1)
    rec.tick()
    folder = tmp_path / "jobs" / str(jid) / "checkpoints"
    with sessions.begin() as s:
        service.stop(s, world.alice, jid)
    rec.tick()  # SIGTERM sent (the fake ends the run at once)
    write(folder)
    rec.tick()
    return job(sessions, jid)


def test_a_stop_says_at_which_step_the_checkpoint_was_saved(sessions, world, rec, tmp_path):
    j = _stop_with_checkpoint(sessions, world, rec, tmp_path,
                              lambda d: (d / "ckpt-000000000040.pt").write_bytes(b"x"))
    assert j.state == "stopped" and j.reason == "stopped by alice; checkpoint saved at step 40"


def test_a_stop_without_a_new_checkpoint_says_what_is_lost(sessions, world, rec, tmp_path):
    import os
    import time

    def old(d):
        (d / "ckpt-000000000008.pt").write_bytes(b"x")
        os.utime(d / "ckpt-000000000008.pt", (time.time() - 120, time.time() - 120))

    j = _stop_with_checkpoint(sessions, world, rec, tmp_path, old)
    assert j.state == "stopped"
    assert "no checkpoint was written on the way out" in j.reason and "at step 8" in j.reason
    assert "work since then is lost" in j.reason and "checkpoint saved" not in j.reason


def test_a_stop_with_no_checkpoint_at_all_says_the_work_is_lost(sessions, world, rec, tmp_path):
    j = _stop_with_checkpoint(sessions, world, rec, tmp_path, lambda d: None)
    assert j.state == "stopped" and "no checkpoint was written" in j.reason and "work so far is lost" in j.reason


def test_a_pruned_trial_says_why_it_was_pruned_not_what_a_resume_would_find(sessions, world, rec, tmp_path):
    """Issue 71: a pruned trial's reason said "it starts over when resumed and its work so far is
    lost"; it is over for good, and its reason is the pruner's."""
    from deeppod.contract import JobState
    from deeppod.store.models import Job, utcnow

    jid = submit(sessions, world.alice, tmp_path, workers=1, gpus_per_worker=1)
    rec.tick()
    with sessions.begin() as s:
        j = s.get(Job, jid)
        j.stop_reason, j.stop_as, j.stop_requested_at = "pruned: below the median at step 3", JobState.PRUNED, utcnow()
    rec.tick()
    rec.tick()
    j = job(sessions, jid)
    assert j.state == "pruned" and j.reason == "pruned: below the median at step 3"


def test_a_stop_whose_worker_outlived_its_grace_says_it_was_killed(sessions, world, rec, tmp_path):
    def killed(d):  # saved, then still running when the grace ended
        (d / "ckpt-000000000040.pt").write_bytes(b"x")
        rec.executor.status[max(rec.executor.launched)] = ExecStatus(finished=True, exit_codes={0: -9},
                                                                     reason="stop requested", stopped=True)

    j = _stop_with_checkpoint(sessions, world, rec, tmp_path, killed)
    assert j.state == "stopped", j.reason
    assert j.reason == ("stopped by alice; checkpoint saved at step 40; rank 0 was killed (SIGKILL) before it "
                        f"exited: a stop gives a job {j.grace_seconds:g} s after SIGTERM (its grace: --grace of "
                        f"deeppod submit "
                        "and deeppod train, or grace_seconds in the API)")


def test_a_preempted_job_is_requeued_with_what_its_checkpoint_kept(sessions, world, rec, tmp_path):
    jid = submit(sessions, world.alice, tmp_path, workers=1, gpus_per_worker=1)
    rec.tick()
    with sessions.begin() as s:  # what the policy's preemption does to the row
        j = s.get(Job, jid)
        j.state, j.reason, j.stop_requested_at = "preempted", "reclaim for tenant b", service.utcnow()
    rec.tick()
    (tmp_path / "jobs" / str(jid) / "checkpoints" / "ckpt-000000000012.pt").write_bytes(b"x")
    rec.tick()
    events = {e.kind: e.message for e in _events(sessions, world, jid)}
    assert "requeued: reclaim for tenant b; checkpoint saved at step 12" in events["requeued"]
    j = job(sessions, jid)  # started again in the same round: the stop time belongs to the last run
    assert j.state == "running" and j.restart_count == 1 and j.stop_requested_at is None


def _events(sessions, world, jid):
    with sessions() as s:
        return service.list_events(s, world.alice, jid)


def test_rounds_with_nothing_to_decide_do_not_write(sessions, world, tmp_path):
    """An idle server, or one that only runs fixed-size jobs, proves its lead (a write) only in
    rounds that act: its loops stay cheap."""
    fences = []
    rec = JobController(sessions, FakeExecutor(), jobs_dir=tmp_path / "jobs", api_url="http://127.0.0.1:1",
                        server_env={"PATH": "/usr/bin"}, fence=lambda s: fences.append(1))
    rec.tick()
    assert fences == [] and rec.rounds == 1
    jid = submit(sessions, world.alice, tmp_path, workers=1, gpus_per_worker=1)
    rec.tick()
    started = len(fences)
    assert job(sessions, jid).state == "running" and started >= 1
    for _ in range(3):
        rec.tick()
    assert len(fences) == started  # it runs, nothing waits: nothing to decide
    rec.executor.finish(jid, {0: 0})
    rec.tick()
    assert job(sessions, jid).state == "succeeded" and len(fences) > started  # that round wrote


def test_points_its_processes_could_not_send_are_taken_when_the_run_ends(sessions, world, rec, tmp_path):
    """runtime/metrics.py keeps what a process could not send (the control plane away past the
    wait at exit) in the checkpoint folder; the run's end stores it as if sent. A link planted
    there is not followed."""
    import json

    from deeppod.contract import METRICS_SPOOL
    from deeppod.jobs import metrics
    from deeppod.store.models import JobMetric

    jid = submit(sessions, world.alice, tmp_path)
    rec.tick()
    spool = rec.launcher.folder(jid).checkpoints / METRICS_SPOOL
    lines = [json.dumps({"step": s, "at": 1.0, "metrics": {"loss": 1.0 / (s + 1)}}) for s in range(3)]
    lines += ["{not json", json.dumps({"step": -1, "metrics": {"loss": 1}}),
              json.dumps({"step": 3, "at": 1.0, "metrics": {"loss": "nan"}, "trial": 2})]
    spool.write_text("\n".join(lines) + "\n")
    rec.executor.finish(jid, {0: 0})
    rec.tick()
    assert job(sessions, jid).state == "succeeded" and not spool.exists()
    with sessions() as s:
        got = s.execute(select(JobMetric.step, JobMetric.value, JobMetric.trial).where(JobMetric.job_id == jid)
                        .order_by(JobMetric.step)).all()
        assert [tuple(r) for r in got] == [(0, 1.0, None), (1, 0.5, None), (2, 1 / 3, None), (3, None, 2)]
        assert metrics.series(s, world.alice, jid)["metrics"]["loss"]["points"] == 4
    said = [e.message for e in _events(sessions, world, jid) if e.kind == "metrics"]
    assert said == ["4 metric points its processes could not send before they exited were taken from its "
                    "folder; 2 lines that were not points left out"]

    other = submit(sessions, world.alice, tmp_path)
    rec.tick()
    outside = tmp_path / "points.jsonl"
    outside.write_text(lines[0] + "\n")
    link = rec.launcher.folder(other).checkpoints / METRICS_SPOOL
    link.symlink_to(outside)
    rec.executor.finish(other, {0: 0})
    rec.tick()
    with sessions() as s:
        assert s.scalars(select(JobMetric).where(JobMetric.job_id == other)).all() == []
    assert outside.read_text() == lines[0] + "\n" and link.is_symlink()


def test_a_run_that_lasts_its_time_limit_is_stopped_to_checkpoint_and_may_be_resumed(sessions, world, tmp_path):
    from datetime import UTC, datetime

    from tests.fixtures import Clock

    clock = Clock()
    rec = JobController(sessions, FakeExecutor(), jobs_dir=tmp_path / "jobs", api_url="http://127.0.0.1:1",
                        clock=clock)
    jid = submit(sessions, world.alice, tmp_path, time_limit_seconds=5400)
    rec.tick()
    with sessions.begin() as s:  # it started at the controller's now
        s.get(Job, jid).started_at = datetime.fromtimestamp(clock.t, UTC)
    clock.t += 5399
    rec.tick()
    assert job(sessions, jid).state == "running" and rec.executor.terminated == []
    clock.t += 1
    rec.tick()  # its limit: SIGTERM, as a stop (the fake ends the run at once)
    assert rec.executor.terminated == [jid]
    (tmp_path / "jobs" / str(jid) / "checkpoints" / "ckpt-000000000012.pt").write_bytes(b"x")
    rec.tick()
    j = job(sessions, jid)
    assert j.state == "stopped", j.reason
    assert j.reason == ("stopped at its time limit of 90m ('deeppod resume' starts its next run); "
                        "checkpoint saved at step 12")
    with sessions() as s:
        events = [e.message for e in s.scalars(select(JobEvent).where(JobEvent.job_id == jid))]
    assert any("its time limit of 90m is reached" in m for m in events), events
    with sessions.begin() as s:
        service.resume(s, world.alice, jid)
    assert job(sessions, jid).state == "queued" and job(sessions, jid).time_limit_seconds == 5400


def test_a_run_its_clusters_scheduler_ended_at_the_time_limit_is_stopped_not_failed(sessions, world, rec, tmp_path):
    jid = submit(sessions, world.alice, tmp_path, time_limit_seconds=60)
    rec.tick()
    rec.executor.status[jid] = ExecStatus(finished=True, exit_codes={0: 75}, timed_out=True)
    rec.tick()
    j = job(sessions, jid)
    assert j.state == "stopped" and j.reason.startswith("stopped at its time limit of 1m ('deeppod resume' starts")


def test_where_a_cluster_that_places_workers_put_them_is_kept_once_and_said(sessions, world, tmp_path):
    slurm = FakeExecutor()
    slurm.queues = True  # as Slurm: it queues and places what it is handed
    rec = JobController(sessions, slurm, jobs_dir=tmp_path / "jobs", api_url="http://127.0.0.1:1",
                        config=Config(phases=HANDED_OFF))
    jid = submit(sessions, world.alice, tmp_path, workers=2, gpus_per_worker=1)
    rec.tick()
    assert {w["node"] for w in job(sessions, jid).allocation["workers"]} == {"(slurm)"}
    placed = ((0, "gpu07", (2,)), (1, "gpu08", (0,)))
    rec.executor.status[jid] = ExecStatus(finished=False, placed=placed)
    rec.tick()
    rec.tick()  # the same word again: nothing new
    assert job(sessions, jid).state == "running"
    workers = job(sessions, jid).allocation["workers"]
    assert [(w["rank"], w["node"], w["gpus"]) for w in workers] == [(0, "gpu07", [2]), (1, "gpu08", [0])]
    with sessions() as s:
        said = [e.message for e in s.scalars(select(JobEvent).where(JobEvent.job_id == jid, JobEvent.kind == "placed"))]
    assert said == ["its cluster's scheduler placed it: rank 0 on gpu07 (GPU 2), rank 1 on gpu08 (GPU 0)"]
