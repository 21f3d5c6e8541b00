"""Who holds which GPU and GPUs held over time (the console's cluster page), on SQLite and
PostgreSQL: a member sees other tenants' GPUs as taken, never by which job."""

from datetime import timedelta

import pytest
from sqlalchemy import select

from deeppod.cluster.allocation import OTHERS, gpu_slots, gpus_over_time
from deeppod.cluster.service import set_gpu_health
from deeppod.contract import JobState
from deeppod.store.models import Job, Node, utcnow
from tests.fixtures import populate, submit_job


def _run(sessions, job_id, gpus, *, started_ago=None, ended_ago=None):
    with sessions.begin() as s:
        job = s.get(Job, job_id)
        node = s.scalar(select(Node.name))
        job.allocation = {"node": node, "workers": [{"rank": 0, "node": node, "gpus": gpus, "cpus": 1.0,
                                                     "memory_mb": 0}]}
        job.state = JobState.RUNNING if ended_ago is None else JobState.SUCCEEDED
        job.started_at = utcnow() - (started_ago or timedelta(minutes=5))
        job.ended_at = None if ended_ago is None else utcnow() - ended_ago


def test_each_gpu_says_free_whose_cordoned_or_down_and_hides_other_tenants_jobs(sessions, tmp_path):
    w = populate(sessions)
    a = submit_job(sessions, w.alice, tmp_path, gpus_per_worker=1, name="alice-job")
    b = submit_job(sessions, w.bob, tmp_path, gpus_per_worker=1, name="bob-job")
    _run(sessions, a, [0])
    _run(sessions, b, [1])
    with sessions.begin() as s:
        set_gpu_health(s.scalar(select(Node)), 3, False, "ECC errors")
    with sessions() as s:
        (node, slots), = gpu_slots(s, w.alice)
        assert [g.state for g in slots] == ["allocated", "allocated", "free", "cordoned"]
        assert (slots[0].job_id, slots[0].job_name, slots[0].tenant) == (a, "alice-job", "a")
        assert (slots[1].job_id, slots[1].job_name, slots[1].tenant) == (None, "", OTHERS)
        assert slots[3].reason == "ECC errors"
        (_, seen), = gpu_slots(s, w.admin)
        assert seen[1].job_id == b and seen[1].tenant == "b"
    with sessions.begin() as s:
        s.scalar(select(Node)).up = False
    with sessions() as s:
        assert [g.state for g in gpu_slots(s, w.admin)[0][1]][2:] == ["down", "down"]


def test_gpus_over_time_per_tenant_with_the_others_as_one_line(sessions, tmp_path):
    w = populate(sessions)
    a = submit_job(sessions, w.alice, tmp_path, gpus_per_worker=1, workers=2)
    old = submit_job(sessions, w.bob, tmp_path, gpus_per_worker=1)
    short = submit_job(sessions, w.bob, tmp_path, gpus_per_worker=1)
    _run(sessions, a, [0, 1], started_ago=timedelta(hours=2))
    _run(sessions, old, [2], started_ago=timedelta(hours=30), ended_ago=timedelta(hours=26))  # before the window
    _run(sessions, short, [3], started_ago=timedelta(hours=3, minutes=2), ended_ago=timedelta(hours=3))
    with sessions() as s:
        mine = gpus_over_time(s, w.alice, hours=24, buckets=24)
        everyone = gpus_over_time(s, w.admin, hours=24, buckets=24)
    assert len(mine["t"]) == 24 and set(mine["tenants"]) == {"a", OTHERS}
    assert mine["tenants"]["a"][-2:] == [2, 2] and mine["tenants"]["a"][:20] == [0] * 20
    assert sum(mine["tenants"][OTHERS]) == pytest.approx(2 / 60, rel=0.01)  # 1 GPU for 2 minutes of an hour
    assert set(everyone["tenants"]) == {"a", "b"}


def test_gpus_held_over_time_is_time_weighted_and_never_above_the_cluster(sessions, tmp_path):
    """40 one-minute jobs one after another on one GPU in the last 50 minutes: 40 jobs touched
    the bucket, but a mean of 40/50 GPUs was held (the sum of jobs read 40 on a 4-GPU cluster)."""
    w = populate(sessions)
    for i in range(40):
        job = submit_job(sessions, w.alice, tmp_path, gpus_per_worker=1)
        _run(sessions, job, [0], started_ago=timedelta(minutes=50 - i), ended_ago=timedelta(minutes=49 - i))
    with sessions() as s:
        held = gpus_over_time(s, w.admin, hours=1, buckets=1)["tenants"]["a"]
    assert held == [pytest.approx(40 / 50, rel=0.01)]  # over the cluster's life: its first job began 50 min ago
    assert held[0] <= 4


def test_a_young_cluster_charts_its_own_life_not_a_day_of_nothing(sessions, tmp_path):
    """Issue 71: a 15-minute-old server's page showed 24 hours, the GPUs in its last minutes."""
    w = populate(sessions)  # its node joined now
    job = submit_job(sessions, w.alice, tmp_path, gpus_per_worker=1)
    _run(sessions, job, [0], started_ago=timedelta(minutes=15))
    with sessions() as s:
        held = gpus_over_time(s, w.admin, hours=24, buckets=15)
    span = held["t"][-1] - held["t"][0]
    assert 14 * 60 - 5 <= span <= 15 * 60 and held["tenants"]["a"] == [pytest.approx(1, rel=0.01)] * 15
