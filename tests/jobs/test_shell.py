"""Which process `deeppod shell` joins, and who may open one: the job's owner or an
administrator with a token that may change things, into a running job's rank on this host."""

import json
import os

import pytest

from deeppod.auth import service as auth
from deeppod.auth.roles import ALL
from deeppod.contract import JobState
from deeppod.errors import Conflict, Forbidden, NotFound
from deeppod.job_folder import JobFolder
from deeppod.jobs.shell import target
from deeppod.store.models import Job
from tests.fixtures import populate, submit_job


def _running(sessions, job_id):
    with sessions.begin() as s:
        s.get(Job, job_id).state = JobState.RUNNING


def test_a_shell_joins_the_rank_asked_for_of_its_owners_running_job(sessions, tmp_path):
    world = populate(sessions)
    jobs_dir = tmp_path / "jobs"
    job_id = submit_job(sessions, world.alice, tmp_path)
    with sessions() as s:
        with pytest.raises(Conflict, match=f"job {job_id} is queued: a shell opens in a running job"):
            target(s, world.alice, job_id, 0, jobs_dir)
    _running(sessions, job_id)
    folder = JobFolder.of(jobs_dir, job_id)
    folder.root.mkdir(parents=True)
    (folder.root / "spec.json").write_text(json.dumps({"sandbox": None}))  # not sandboxed: the pid itself
    folder.write_pids({"0": os.getpid(), "1": 2 ** 22 + 7})  # rank 1's process is gone
    with sessions() as s:
        assert target(s, world.alice, job_id, 0, jobs_dir) == os.getpid()
        assert target(s, world.admin, job_id, 0, jobs_dir) == os.getpid()
        with pytest.raises(Conflict, match="rank 1 is not running now"):
            target(s, world.alice, job_id, 1, jobs_dir)
        with pytest.raises(NotFound, match=r"no rank 5 on this server's host \(its ranks here: 0, 1\)"):
            target(s, world.alice, job_id, 5, jobs_dir)
        with pytest.raises(NotFound, match=f"job {job_id} not found"):
            target(s, world.bob, job_id, 0, jobs_dir)  # another tenant's


def test_a_shell_needs_a_user_token_that_may_change_things(sessions, tmp_path):
    world = populate(sessions)
    job_id = submit_job(sessions, world.alice, tmp_path)
    _running(sessions, job_id)
    with sessions.begin() as s:
        _, mate_token = auth.create_user(s, world.admin, "carol", "a")  # alice's tenant-mate
        mate = auth.authenticate(s, mate_token)
        job_token = auth.issue_job_token(s, world.alice.user_id, job_id, ALL)
        reader_token = auth.create_token(s, world.alice, "ro", scope="read")[1]
    with sessions() as s:
        with pytest.raises(NotFound):
            target(s, mate, job_id, 0, tmp_path)
        with pytest.raises(Forbidden, match="a job's token cannot open a shell"):
            target(s, auth.authenticate(s, job_token), job_id, 0, tmp_path)
        with pytest.raises(Forbidden, match="only reads"):
            target(s, auth.authenticate(s, reader_token), job_id, 0, tmp_path)
