"""Notebooks as jobs: what a start makes, the plan's idle limit, who reaches one, and idle
notebooks stopped (one step at a time, a fake activity reader: no Jupyter here)."""

from datetime import timedelta

import pytest

from deeppod.auth import service as auth
from deeppod.contract import JobState
from deeppod.errors import InvalidRequest, NotFound, Unavailable
from deeppod.jobs.code import CodeStore
from deeppod.notebooks import idle, service
from deeppod.notebooks.upstream import SOCKET_NAME
from deeppod.plans.service import apply_plan
from deeppod.store.models import Job, utcnow
from tests.fixtures import populate, submit_job


def _start(sessions, who, tmp_path, **ask):
    with sessions.begin() as s:
        job = service.start(s, who, service.NotebookStart(**ask), idle_default=7200, default_grace=30,
                            code=CodeStore(tmp_path / "code", 1 << 20, 1 << 20), jobs_dir=tmp_path / "jobs")
        return job.id


def test_a_notebook_is_a_queued_job_serving_jupyterlab_under_its_own_path(sessions, tmp_path):
    world = populate(sessions)
    job_id = _start(sessions, world.alice, tmp_path, name="explore", gpus_per_worker=1)
    with sessions() as s:
        job = s.get(Job, job_id)
        assert (job.kind, job.state, job.name, job.gpus_per_worker) == ("notebook", JobState.QUEUED, "explore", 1)
        assert job.preemptible and job.idle_limit_seconds == 7200  # the server's default: the plan names none
        assert job.command[1:3] == ["-m", "jupyterlab"] and f"--ServerApp.base_url=/notebooks/{job_id}/" in \
            job.command and f"--ServerApp.sock={SOCKET_NAME}" in job.command
        assert job.workdir == str(tmp_path / "jobs" / str(job_id) / "code")  # a folder of its own: its files
    assert service.url(job_id) == f"/notebooks/{job_id}/lab"


def test_the_plans_idle_limit_is_the_default_and_the_most_one_may_ask(sessions, tmp_path):
    world = populate(sessions)
    with sessions.begin() as s:
        apply_plan(s, world.admin, {"tenants": [{"name": "a", "guaranteed": 0, "notebook_idle_hours": 1},
                                                {"name": "b", "guaranteed": 0}]})
    made = [_start(sessions, world.alice, tmp_path), _start(sessions, world.alice, tmp_path, idle_seconds=1800),
            _start(sessions, world.bob, tmp_path, idle_seconds=86400)]
    with sessions() as s:
        assert [s.get(Job, i).idle_limit_seconds for i in made] == [3600, 1800, 86400]
    with pytest.raises(InvalidRequest, match=r"more than tenant a's plan allows .* \(1h\)"):
        _start(sessions, world.alice, tmp_path, idle_seconds=7200)


def test_only_its_owner_or_an_administrator_reaches_a_notebook(sessions, tmp_path):
    world = populate(sessions)
    with sessions.begin() as s:
        _, carol_token = auth.create_user(s, world.admin, "carol", "a")  # alice's tenant-mate
        carol = auth.authenticate(s, carol_token)
    job_id = _start(sessions, world.alice, tmp_path)
    batch = submit_job(sessions, world.alice, tmp_path)
    with sessions() as s:
        assert service.reachable(s, world.alice, job_id).id == job_id
        assert service.reachable(s, world.admin, job_id).id == job_id
        for other in (world.bob, carol):
            with pytest.raises(NotFound, match=f"notebook {job_id} not found"):
                service.reachable(s, other, job_id)
        with pytest.raises(NotFound, match=f"job {batch} is not a notebook"):
            service.get_notebook(s, world.alice, batch)
        with pytest.raises(NotFound, match=f"notebook {batch} not found"):
            service.reachable(s, world.alice, batch)


def _running(sessions, job_id, started):
    with sessions.begin() as s:
        job = s.get(Job, job_id)
        job.state, job.started_at = JobState.RUNNING, started


def test_an_idle_notebook_is_stopped_resumably_and_a_busy_or_silent_one_is_left(sessions, tmp_path):
    world = populate(sessions)
    now = utcnow()
    ids = [_start(sessions, world.alice, tmp_path, idle_seconds=600) for _ in range(4)]
    for job_id in ids:
        _running(sessions, job_id, now - timedelta(hours=1))
    last = {ids[0]: now - timedelta(minutes=11),  # idle past its 10 minutes
            ids[1]: now - timedelta(minutes=9),  # a kernel ran 9 minutes ago
            ids[2]: None}  # no kernel ever: idle since it started, an hour ago

    def activity(job, at):
        assert at == now
        if job.id == ids[3]:
            raise Unavailable("not answering")  # still starting, or gone: left alone this round
        return last[job.id]

    with sessions.begin() as s:
        assert idle.cull(s, activity, now) == [ids[0], ids[2]]
    with sessions.begin() as s:
        assert idle.cull(s, activity, now) == []  # asked once
        job = s.get(Job, ids[0])
        assert job.stop_reason.startswith("idle: no kernel or terminal activity for 10m")
        assert f"--resume {ids[0]}" in job.stop_reason and job.stop_as is None  # stopped: resumable
        assert s.get(Job, ids[1]).stop_requested_at is None and s.get(Job, ids[3]).stop_requested_at is None
