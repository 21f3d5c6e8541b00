"""The controller side of the multi-tenant policy, with the fake executor: preemption and
resize requeue with the same id, failures restart up to max_restarts avoiding the failed
GPUs, reasons are recorded as events, cordons requeue."""


import pytest

from deeppod.cluster.service import set_health
from deeppod.executor.fake import FakeExecutor
from deeppod.jobs import service
from deeppod.jobs.controller import JobController
from deeppod.plans.service import apply_plan, plan_status
from deeppod.scheduler import Config
from deeppod.store.models import Job
from tests.fixtures import Clock, load_job, populate, submit_job


@pytest.fixture
def world(sessions):
    return populate(sessions)  # one node with 4 logical GPUs; tenants a (alice) and b (bob)


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def rec(sessions, tmp_path, clock):
    return JobController(sessions, FakeExecutor(), jobs_dir=tmp_path / "jobs", api_url="http://127.0.0.1:1",
                      config=Config(min_run_before_resize=0, reserve_after_seconds=1e9), clock=clock)


submit = submit_job
job = load_job


def events(sessions, who, job_id):
    with sessions() as s:
        return [(e.kind, e.message) for e in service.list_events(s, who, job_id)]


def gpus_of(j):
    return sum(len(w["gpus"]) for w in j.allocation["workers"])


def test_reclaim_shrinks_the_borrower_and_it_resumes_with_the_same_id(sessions, world, rec, tmp_path):
    with sessions.begin() as s:
        apply_plan(s, world.admin, {"tenants": [{"name": "a", "guaranteed": 2}, {"name": "b", "guaranteed": 2}]})
    b_job = submit(sessions, world.bob, tmp_path, workers=1, max_workers=4, gpus_per_worker=1)
    rec.tick()
    assert job(sessions, b_job).state == "running" and gpus_of(job(sessions, b_job)) == 4  # b borrows all 4
    a_job = submit(sessions, world.alice, tmp_path, workers=2, gpus_per_worker=1)
    rec.tick()
    j = job(sessions, b_job)
    assert j.state == "resizing" and j.resize_to == 2 and "reclaim for tenant a" in j.reason
    assert b_job in rec.executor.terminated  # SIGTERM sent
    assert job(sessions, a_job).state == "queued"  # the GPUs are not back yet
    rec.tick()  # the fake stops at once: b requeues, then both start
    a, b = job(sessions, a_job), job(sessions, b_job)
    assert a.state == "running" and gpus_of(a) == 2
    assert b.state == "running" and gpus_of(b) == 2 and b.restart_count == 1 and b.id == b_job
    kinds = [k for k, _ in events(sessions, world.bob, b_job)]
    assert kinds == ["queued", "started", "resizing", "requeued", "started"]
    assert rec.executor.launched[b_job].workers[0].env["DEEPPOD_RESTART_COUNT"] == "1"
    with sessions() as s:
        rows = {r.name: r for r in plan_status(s, world.admin)}
    assert (rows["a"].in_use, rows["b"].in_use, rows["b"].borrowed) == (2, 2, 0)


def test_reclaim_preempts_a_whole_job_when_nothing_can_shrink(sessions, world, rec, tmp_path):
    with sessions.begin() as s:
        apply_plan(s, world.admin, {"tenants": [{"name": "a", "guaranteed": 2}, {"name": "b", "guaranteed": 0}]})
    b_job = submit(sessions, world.bob, tmp_path, workers=4, gpus_per_worker=1)
    rec.tick()
    a_job = submit(sessions, world.alice, tmp_path, workers=2, gpus_per_worker=1)
    rec.tick()
    assert job(sessions, b_job).state == "preempted"
    rec.tick()
    assert job(sessions, a_job).state == "running"
    b = job(sessions, b_job)
    assert b.state == "queued" and b.restart_count == 1 and "waiting for 4 GPUs" in b.reason
    kinds = [k for k, _ in events(sessions, world.bob, b_job)]
    assert kinds == ["queued", "started", "preempted", "requeued", "waiting"]
    assert "reclaim for tenant a" in events(sessions, world.bob, b_job)[2][1]


def test_failed_worker_restarts_up_to_max_restarts_avoiding_its_gpus(sessions, world, rec, tmp_path):
    jid = submit(sessions, world.alice, tmp_path, workers=1, gpus_per_worker=1, max_restarts=1)
    rec.tick()
    first_gpu = job(sessions, jid).allocation["workers"][0]["gpus"][0]
    rec.executor.finish(jid, {0: 1}, reason="rank 0 exited with code 1")
    rec.tick()
    j = job(sessions, jid)
    assert j.state == "running" and j.restart_count == 1
    assert j.allocation["workers"][0]["gpus"][0] != first_gpu
    assert any(k == "requeued" and "restart 1 of 1" in m for k, m in events(sessions, world.alice, jid))
    rec.executor.finish(jid, {0: 1}, reason="rank 0 exited with code 1")
    rec.tick()
    assert job(sessions, jid).state == "failed"


def test_waiting_reason_is_recorded_once_not_every_round(sessions, world, rec, tmp_path):
    submit(sessions, world.alice, tmp_path, workers=4, gpus_per_worker=1)
    waiting = submit(sessions, world.alice, tmp_path, workers=2, gpus_per_worker=1)
    for _ in range(5):
        rec.tick()
    j = job(sessions, waiting)
    assert j.state == "queued" and "waiting for 2 GPUs" in j.reason
    assert [k for k, _ in events(sessions, world.alice, waiting)].count("waiting") == 1


def test_cordoned_gpu_requeues_its_job_elsewhere(sessions, world, rec, tmp_path):
    jid = submit(sessions, world.alice, tmp_path, workers=1, gpus_per_worker=1)
    rec.tick()
    j = job(sessions, jid)
    node, gpu = j.allocation["workers"][0]["node"], j.allocation["workers"][0]["gpus"][0]
    with sessions.begin() as s:
        set_health(s, world.admin, node, False, gpu)
    rec.tick()
    assert job(sessions, jid).state == "preempted"
    rec.tick()
    j = job(sessions, jid)
    assert j.state == "running" and j.allocation["workers"][0]["gpus"][0] != gpu


def test_cancel_during_preemption_ends_cancelled(sessions, world, rec, tmp_path):
    with sessions.begin() as s:
        apply_plan(s, world.admin, {"tenants": [{"name": "a", "guaranteed": 4}]})
    b_job = submit(sessions, world.bob, tmp_path, workers=4, gpus_per_worker=1)
    rec.tick()
    submit(sessions, world.alice, tmp_path, workers=4, gpus_per_worker=1)
    with sessions.begin() as s:
        s.get(Job, b_job).cancel_requested = True
    rec.tick()
    rec.tick()
    assert job(sessions, b_job).state == "cancelled"


def test_plan_changes_apply_at_the_next_round_without_restarts(sessions, world, rec, tmp_path):
    a1 = submit(sessions, world.alice, tmp_path, workers=2, gpus_per_worker=1)
    a2 = submit(sessions, world.alice, tmp_path, workers=2, gpus_per_worker=1)
    rec.tick()
    assert job(sessions, a1).state == job(sessions, a2).state == "running"
    with sessions.begin() as s:
        apply_plan(s, world.admin, {"tenants": [{"name": "a", "guaranteed": 0, "max": 2},
                                                {"name": "b", "guaranteed": 2}]})
    rec.tick()
    # nothing restarts because of a plan change alone...
    assert job(sessions, a1).state == job(sessions, a2).state == "running"
    # ...but b's guarantee is honoured at once by reclaim
    b = submit(sessions, world.bob, tmp_path, workers=2, gpus_per_worker=1)
    rec.tick()
    rec.tick()
    assert job(sessions, b).state == "running"


def test_a_new_job_preempts_one_that_has_run_longer_and_that_one_keeps_its_service(sessions, world, tmp_path, clock):
    """Least attained service through the controller: the long job's GPU-seconds are kept
    when it requeues (its class), and the round's snapshot carries them."""
    from datetime import timedelta

    from deeppod.store.models import utcnow

    clock.t = utcnow().timestamp()  # the policy's clock; run times are the database rows' wall-clock times
    rec = JobController(sessions, FakeExecutor(), jobs_dir=tmp_path / "jobs", api_url="http://127.0.0.1:1",
                        config=Config(reserve_after_seconds=1e9, las_thresholds=(60.0,), min_run_before_las_preempt=0,
                                      starve_after=1e9), clock=clock)
    long_job = submit(sessions, world.alice, tmp_path, workers=4, gpus_per_worker=1)
    rec.tick()
    started = utcnow() - timedelta(seconds=100)
    with sessions.begin() as s:
        s.get(Job, long_job).started_at = started  # 400 GPU-seconds: class 1

    def service_so_far() -> float:  # 4 GPUs since ``started``, by the wall clock: a loaded machine adds to it
        return 4 * (utcnow() - started).total_seconds()

    with sessions() as s:
        [running] = rec.snapshot(s).running
    assert 400 <= running.attained <= service_so_far()
    short = submit(sessions, world.alice, tmp_path, workers=1, gpus_per_worker=1)
    rec.tick()
    j = job(sessions, long_job)
    assert j.state == "preempted" and "least attained service" in j.reason and f"job {short}" in j.reason
    rec.tick()  # the fake stops at once: the long job requeues with its service counted
    j = job(sessions, long_job)
    assert j.state == "queued" and 400 <= j.attained_gpu_seconds <= service_so_far() and j.queued_at is not None
    assert job(sessions, short).state == "running"
    with sessions() as s:
        [queued] = rec.snapshot(s).queued
    assert queued.id == long_job and queued.attained == j.attained_gpu_seconds
