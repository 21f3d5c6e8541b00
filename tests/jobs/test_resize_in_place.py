"""The controller's side of an in-place resize, with the fake executor: a job that marked
itself resizable keeps running; the world file names the new size; the leaving workers'
GPUs come free when they have exited and rank 0 acknowledged; a grow starts joiners that
receive the model; a switch that fails or stalls falls back to a checkpoint restart."""

import json
import time

import pytest

from deeppod.contract import ENV_JOINING, ENV_WORLD_GENERATION, JOINER_READY, RESIZABLE_MARK, RESTART_MARK, WORLD_ACK
from deeppod.executor.base import ExecStatus
from deeppod.executor.fake import FakeExecutor
from deeppod.job_folder import JobFolder
from deeppod.jobs import service
from deeppod.jobs.controller import JobController
from deeppod.jobs.resize import IN_PLACE_TIMEOUT_S
from deeppod.plans.service import apply_plan
from deeppod.scheduler import Config
from tests.fixtures import Clock, load_job, populate
from tests.fixtures import submit_job as submit
from tests.helpers import wait_until


@pytest.fixture
def world(sessions):
    return populate(sessions)  # one node, 4 logical GPUs; tenants a (alice) and b (bob)


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def rec(sessions, tmp_path, clock):
    return JobController(sessions, FakeExecutor(), jobs_dir=tmp_path / "jobs", api_url="http://127.0.0.1:1",
                         config=Config(min_run_before_resize=0, reserve_after_seconds=1e9, las_preemption=False),
                         clock=clock)


def ranks(j):
    return [w["rank"] for w in j.allocation["workers"]]


def events(sessions, who, job_id):
    with sessions() as s:
        return [(e.kind, e.message) for e in service.list_events(s, who, job_id)]


def mark_resizable(rec, job_id):
    ckpt = rec.job_dir(job_id) / "checkpoints"
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / RESIZABLE_MARK).write_text("1")


def ack(rec, job_id, generation, at):
    (rec.job_dir(job_id) / "checkpoints" / WORLD_ACK).write_text(json.dumps({"generation": generation, "at": at}))


def borrow_all_then_reclaim(sessions, world, rec, tmp_path):
    with sessions.begin() as s:
        apply_plan(s, world.admin, {"tenants": [{"name": "a", "guaranteed": 2}, {"name": "b", "guaranteed": 2}]})
    b_job = submit(sessions, world.bob, tmp_path, workers=1, max_workers=4, gpus_per_worker=1)
    rec.tick()
    assert ranks(load_job(sessions, b_job)) == [0, 1, 2, 3]
    mark_resizable(rec, b_job)
    a_job = submit(sessions, world.alice, tmp_path, workers=2, gpus_per_worker=1)
    rec.tick()
    return a_job, b_job


def test_a_shrink_in_place_keeps_the_job_running_and_frees_the_leavers_gpus_once_they_exit(
        sessions, world, rec, tmp_path, clock):
    a_job, b_job = borrow_all_then_reclaim(sessions, world, rec, tmp_path)
    b = load_job(sessions, b_job)
    assert b.state == "running" and b_job not in rec.executor.terminated  # no SIGTERM: the workers stay
    w = json.loads(JobFolder(rec.job_dir(b_job)).world_file.read_text())
    assert (w["generation"], w["world_size"], w["master_port"]) == (1, 2, 29500)
    assert ranks(b) == [0, 1, 2, 3] and b.resize_to == 2  # the leavers still hold their GPUs
    rec.tick()
    assert load_job(sessions, a_job).state == "queued"  # nothing free yet, and no second shrink
    assert ranks(load_job(sessions, b_job)) == [0, 1, 2, 3]
    # rank 0 acknowledges the first step at 2 workers, and ranks 2 and 3 have exited
    rec.executor.status[b_job] = ExecStatus(finished=False, exit_codes={2: 0, 3: 0})
    ack(rec, b_job, 1, clock.t + 2.5)
    rec.tick()
    b = load_job(sessions, b_job)
    assert b.state == "running" and ranks(b) == [0, 1] and b.resize_to is None and b.restart_count == 0
    assert load_job(sessions, a_job).state == "running"
    kinds = events(sessions, world.bob, b_job)
    assert [k for k, _ in kinds] == ["queued", "started", "resizing", "resized"]
    assert "in place: the workers stay; ranks 2-3 leave" in kinds[2][1]
    assert "from 4 to 2 workers: 2.5 s from the decision" in kinds[3][1]
    # the job ends later with its two workers: success, though four exit codes are on record
    rec.executor.finish(b_job, {0: 0, 1: 0, 2: 0, 3: 0})
    rec.tick()
    assert load_job(sessions, b_job).state == "succeeded"


def test_a_job_that_is_not_resizable_restarts_as_before(sessions, world, rec, tmp_path):
    with sessions.begin() as s:
        apply_plan(s, world.admin, {"tenants": [{"name": "a", "guaranteed": 2}, {"name": "b", "guaranteed": 2}]})
    b_job = submit(sessions, world.bob, tmp_path, workers=1, max_workers=4, gpus_per_worker=1)
    rec.tick()
    submit(sessions, world.alice, tmp_path, workers=2, gpus_per_worker=1)
    rec.tick()
    b = load_job(sessions, b_job)
    assert b.state == "resizing" and b_job in rec.executor.terminated
    assert "restarts from its checkpoint with 2 workers" in events(sessions, world.bob, b_job)[-1][1]


def test_a_job_that_says_why_it_resizes_by_a_restart_has_it_in_the_event(sessions, world, rec, tmp_path):
    with sessions.begin() as s:
        apply_plan(s, world.admin, {"tenants": [{"name": "a", "guaranteed": 2}, {"name": "b", "guaranteed": 2}]})
    b_job = submit(sessions, world.bob, tmp_path, workers=1, max_workers=4, gpus_per_worker=1)
    rec.tick()
    ckpt = rec.job_dir(b_job) / "checkpoints"
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / RESTART_MARK).write_text("its model is sharded: a new size loads the sharded checkpoint")
    submit(sessions, world.alice, tmp_path, workers=2, gpus_per_worker=1)
    rec.tick()
    assert load_job(sessions, b_job).state == "resizing" and b_job in rec.executor.terminated
    assert events(sessions, world.bob, b_job)[-1][1].endswith(
        "restarts from its checkpoint with 2 workers (its model is sharded: a new size loads the sharded checkpoint)")
    JobFolder(rec.job_dir(b_job)).reset_world()  # the next run says it again, or not
    assert not (ckpt / RESTART_MARK).exists()


def test_a_grow_in_place_starts_joiners_with_the_new_world(sessions, world, rec, tmp_path, clock):
    other = submit(sessions, world.alice, tmp_path, workers=2, gpus_per_worker=1)
    rec.tick()
    job = submit(sessions, world.alice, tmp_path, workers=1, max_workers=4, gpus_per_worker=1)
    rec.tick()
    assert ranks(load_job(sessions, job)) == [0, 1]
    clock.t = time.time() + 1  # run times are wall-clock times: it has run a second
    mark_resizable(rec, job)
    rec.executor.finish(other, {0: 0, 1: 0})
    rec.tick()  # two GPUs free: the job grows into them in place
    j = load_job(sessions, job)
    assert j.state == "running" and ranks(j) == [0, 1, 2, 3] and job not in rec.executor.terminated
    [(generation, joiners)] = rec.executor.added[job]
    assert generation == 1 and [w.rank for w in joiners] == [2, 3] and {w.node_cpus for w in joiners} == {8}
    env = joiners[0].env
    assert (env["WORLD_SIZE"], env[ENV_JOINING], env[ENV_WORLD_GENERATION], env["MASTER_PORT"]) == ("4", "1", "1",
                                                                                                    "29500")
    assert env["CUDA_VISIBLE_DEVICES"] != rec.executor.launched[job].workers[0].env["CUDA_VISIBLE_DEVICES"]
    # the running workers are told only once the joiners are ready: they train meanwhile
    rec.tick()
    assert not JobFolder(rec.job_dir(job)).world_file.exists()
    ckpt = rec.job_dir(job) / "checkpoints"
    (ckpt / JOINER_READY.format(rank=2)).write_text("1")
    looked = rec.resizes.looks
    wait_until(lambda: rec.resizes.looks >= looked + 2, 5, interval=0.01, what="the watch to look again")
    assert not rec.hurry.is_set()  # one joiner of two is ready: nothing to hurry for
    (ckpt / JOINER_READY.format(rank=3)).write_text("1")
    # the loop is hurried as soon as both are: the others are told now, not a round later
    wait_until(rec.hurry.is_set, 5, interval=0.01, what="the controller to be hurried")
    wait_until(lambda: not rec.resizes.watching, 5, interval=0.01, what="the watch to end")
    rec.tick()
    w = json.loads(JobFolder(rec.job_dir(job)).world_file.read_text())
    assert (w["generation"], w["world_size"]) == (1, 4)
    ack(rec, job, 1, clock.t + 4.0)
    rec.tick()
    j = load_job(sessions, job)
    assert ranks(j) == [0, 1, 2, 3] and "resize" not in j.allocation
    assert "from 2 to 4 workers: 4.0 s" in events(sessions, world.alice, job)[-1][1]


def test_a_worker_that_fails_during_the_switch_falls_back_to_a_restart_at_the_new_size(
        sessions, world, rec, tmp_path):
    _, b_job = borrow_all_then_reclaim(sessions, world, rec, tmp_path)
    rec.executor.finish(b_job, {0: 1, 1: 0, 2: -9, 3: 0}, reason="rank 2 was killed by SIGKILL")
    rec.tick()
    b = load_job(sessions, b_job)
    assert b.state in ("queued", "running") and b.restart_count == 1
    requeued = [m for k, m in events(sessions, world.bob, b_job) if k == "requeued"]
    assert requeued and "in-place resize to 2 workers failed" in requeued[0]
    assert len(rec.executor.launched[b_job].workers) == 2  # it restarted at the new size


def test_a_switch_that_stalls_falls_back_to_a_restart(sessions, world, rec, tmp_path, clock):
    _, b_job = borrow_all_then_reclaim(sessions, world, rec, tmp_path)
    clock.t += IN_PLACE_TIMEOUT_S + 1
    rec.tick()
    b = load_job(sessions, b_job)
    assert b.state == "resizing" and b.resize_to == 2 and b_job in rec.executor.terminated
    assert "did not finish in" in b.reason


def test_a_resizable_job_below_its_largest_size_keeps_warm_spares(sessions, world, tmp_path, clock):
    rec = JobController(sessions, FakeExecutor(), jobs_dir=tmp_path / "jobs", api_url="http://127.0.0.1:1",
                        config=Config(min_run_before_resize=0, reserve_after_seconds=1e9, las_preemption=False),
                        clock=clock, spares=2)
    other = submit(sessions, world.alice, tmp_path, workers=3, gpus_per_worker=1)
    rec.tick()
    job = submit(sessions, world.alice, tmp_path, workers=1, max_workers=4, gpus_per_worker=1)
    rec.tick()
    assert ranks(load_job(sessions, job)) == [0]
    rec.tick()
    assert job not in rec.executor.spares  # not resizable (yet): a spare would run as one more worker
    mark_resizable(rec, job)
    rec.tick()
    assert rec.executor.spares[job] == 2 and load_job(sessions, job).allocation["spares"] == 2  # 3 to grow by: 2
    clock.t = time.time() + 1
    rec.executor.finish(other, {0: 0, 1: 0, 2: 0})
    rec.tick()  # three GPUs free: it grows to 4 in place, its largest size
    rec.executor.status[job] = ExecStatus(finished=False)
    for r in (1, 2, 3):
        (rec.job_dir(job) / "checkpoints" / JOINER_READY.format(rank=r)).write_text("1")
    rec.tick()
    ack(rec, job, 1, clock.t + 1)
    rec.tick()
    j = load_job(sessions, job)
    assert ranks(j) == [0, 1, 2, 3] and not j.allocation.get("resize")
    rec.tick()
    assert rec.executor.spares[job] == 0  # nothing left to grow into: none kept


def test_spares_used_by_a_grow_are_asked_for_again(sessions, world, tmp_path, clock):
    rec = JobController(sessions, FakeExecutor(), jobs_dir=tmp_path / "jobs", api_url="http://127.0.0.1:1",
                        config=Config(min_run_before_resize=0, reserve_after_seconds=1e9, las_preemption=False),
                        clock=clock, spares=1)
    others = [submit(sessions, world.alice, tmp_path, workers=1, gpus_per_worker=1) for _ in range(2)]
    rec.tick()
    job = submit(sessions, world.alice, tmp_path, workers=1, max_workers=4, gpus_per_worker=1)
    rec.tick()
    assert ranks(load_job(sessions, job)) == [0, 1]  # and the two GPUs left
    mark_resizable(rec, job)
    rec.tick()
    assert rec.executor.spares[job] == 1
    rec.executor.spares[job] = 0  # what the supervisor keeps after handing its spare to the joiner
    clock.t = time.time() + 1
    rec.executor.finish(others[0], {0: 0})
    rec.tick()  # one GPU free: it grows 2 -> 3 in place
    rec.executor.status[job] = ExecStatus(finished=False)
    (rec.job_dir(job) / "checkpoints" / JOINER_READY.format(rank=2)).write_text("1")
    rec.tick()
    ack(rec, job, 1, clock.t + 1)
    rec.tick()
    assert ranks(load_job(sessions, job)) == [0, 1, 2]
    rec.tick()
    assert rec.executor.spares[job] == 1  # it can still grow by one: a spare again


def test_spares_fit_in_the_memory_left_on_rank_zeros_node_and_hold_it(sessions, tmp_path, clock):
    from deeppod.cluster.service import usage as node_usage

    people = populate(sessions, gpus=8, cpus=32, memory_mb=20000)
    rec = JobController(sessions, FakeExecutor(), jobs_dir=tmp_path / "jobs", api_url="http://127.0.0.1:1",
                        config=Config(min_run_before_resize=0, reserve_after_seconds=1e9, las_preemption=False),
                        clock=clock, spares=2)
    submit(sessions, people.alice, tmp_path, workers=6, gpus_per_worker=1, memory_mb_per_worker=1)
    rec.tick()
    job = submit(sessions, people.alice, tmp_path, workers=1, max_workers=4, gpus_per_worker=1,
                 memory_mb_per_worker=6000)
    rec.tick()
    j = load_job(sessions, job)
    assert ranks(j) == [0, 1]  # 12,006 of 20,000 MiB taken: room to grow by 2, memory for 1 spare
    mark_resizable(rec, job)
    rec.tick()
    assert rec.executor.spares[job] == 1 and load_job(sessions, job).allocation["spares"] == 1
    with sessions() as s:
        assert node_usage(s)[j.allocation["workers"][0]["node"]].memory_mb == 18006
    late = submit(sessions, people.bob, tmp_path, workers=1, gpus_per_worker=0, memory_mb_per_worker=6000)
    rec.tick()
    assert load_job(sessions, late).state == "queued"  # 1,994 MiB left: the spare holds the rest
    rec.tick()
    assert rec.executor.spares[job] == 1  # its own spare does not count against it


def test_a_grow_whose_joiners_never_get_ready_falls_back_and_stops_watching_them(
        sessions, world, rec, tmp_path, clock):
    other = submit(sessions, world.alice, tmp_path, workers=2, gpus_per_worker=1)
    rec.tick()
    job = submit(sessions, world.alice, tmp_path, workers=1, max_workers=4, gpus_per_worker=1)
    rec.tick()
    clock.t = time.time() + 1
    mark_resizable(rec, job)
    rec.executor.finish(other, {0: 0, 1: 0})
    rec.tick()  # grows in place: joiners started, watched until they are ready
    assert job in rec.resizes.watching and not rec.hurry.is_set()
    clock.t += IN_PLACE_TIMEOUT_S + 1
    rec.tick()
    assert load_job(sessions, job).state == "resizing"  # back to the checkpoint restart
    assert job not in rec.resizes.watching and not rec.hurry.is_set()


def test_a_job_on_real_gpus_keeps_no_warm_spares(sessions, world, tmp_path, clock):
    """Issue 70: a spare ran the job's code with every GPU device of its node. It now holds none,
    so a worker on a real GPU starts as itself, and such a job keeps no spares to waste."""
    from sqlalchemy import select

    from deeppod.store.models import Node

    with sessions.begin() as s:  # the node's GPUs are real ones (NVML), not logical slots
        node = s.scalar(select(Node))
        node.gpus = [{**g, "logical": False} for g in node.gpus]
    rec = JobController(sessions, FakeExecutor(), jobs_dir=tmp_path / "jobs", api_url="http://127.0.0.1:1",
                        config=Config(min_run_before_resize=0, reserve_after_seconds=1e9, las_preemption=False),
                        clock=clock, spares=2)
    submit(sessions, world.alice, tmp_path, workers=3, gpus_per_worker=1)  # holds the other GPUs
    rec.tick()
    job = submit(sessions, world.alice, tmp_path, workers=1, max_workers=4, gpus_per_worker=1)
    rec.tick()
    mark_resizable(rec, job)
    rec.tick()
    assert ranks(load_job(sessions, job)) == [0] and job not in rec.executor.spares  # could grow by 3: keeps none
    assert not load_job(sessions, job).allocation.get("spares")
