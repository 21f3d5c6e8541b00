"""Removing finished jobs' folders: by hand, in bulk, and by the retention setting."""

from datetime import timedelta

import pytest

from deeppod.errors import Conflict, NotFound
from deeppod.jobs import retention, service
from deeppod.store.models import Job, utcnow
from tests.fixtures import populate, submit_job


def finished(sessions, who, tmp_path, jobs_dir, state="succeeded", days_ago=0.0) -> int:
    job_id = submit_job(sessions, who, tmp_path, gpus_per_worker=0)
    with sessions.begin() as s:
        job = s.get(Job, job_id)
        job.state, job.ended_at = state, utcnow() - timedelta(days=days_ago)
    folder = jobs_dir / str(job_id)
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "rank-0.log").write_bytes(b"x" * 1000)
    (folder / "checkpoints" / "step-1.pt").write_bytes(b"y" * 2000)
    return job_id


def test_rm_removes_a_finished_jobs_folder_and_keeps_its_record(sessions, tmp_path):
    world, jobs_dir = populate(sessions), tmp_path / "jobs"
    done = finished(sessions, world.alice, tmp_path, jobs_dir)
    running = submit_job(sessions, world.alice, tmp_path, gpus_per_worker=0)
    with sessions.begin() as s:
        assert retention.purge(s, world.alice, done, jobs_dir) == 3000
    assert not (jobs_dir / str(done)).exists()
    with sessions.begin() as s:
        job = service.get_job(s, world.alice, done)
        assert job.purged_at is not None and job.state == "succeeded"
        assert [e.kind for e in service.list_events(s, world.alice, done)][-1] == "purged"
        assert retention.purge(s, world.alice, done, jobs_dir) == 0  # again: nothing to do
        with pytest.raises(Conflict, match="cancel it first"):
            retention.purge(s, world.alice, running, jobs_dir)
        with pytest.raises(NotFound):  # another tenant's: as if it did not exist
            retention.purge(s, world.bob, done, jobs_dir)


def test_a_stopped_job_keeps_its_checkpoint_unless_forced(sessions, tmp_path):
    world, jobs_dir = populate(sessions), tmp_path / "jobs"
    stopped = finished(sessions, world.alice, tmp_path, jobs_dir, state="stopped", days_ago=100)
    with sessions.begin() as s:
        with pytest.raises(Conflict, match="resume"):
            retention.purge(s, world.alice, stopped, jobs_dir)
        assert retention.purge_finished(s, world.admin, jobs_dir, older_than=timedelta(0))[0] == []
    assert retention.apply_retention(sessions, jobs_dir, days=1) == []
    assert (jobs_dir / str(stopped) / "checkpoints" / "step-1.pt").exists()
    with sessions.begin() as s:
        retention.purge(s, world.alice, stopped, jobs_dir, force=True)
    with sessions.begin() as s:
        with pytest.raises(Conflict, match="were removed"):
            service.resume(s, world.alice, stopped)


def test_purge_takes_only_old_jobs_of_the_callers_tenant(sessions, tmp_path):
    world, jobs_dir = populate(sessions), tmp_path / "jobs"
    old_a = finished(sessions, world.alice, tmp_path, jobs_dir, days_ago=10)
    new_a = finished(sessions, world.alice, tmp_path, jobs_dir, days_ago=0)
    old_b = finished(sessions, world.bob, tmp_path, jobs_dir, state="failed", days_ago=10)
    with sessions.begin() as s:
        ids, freed = retention.purge_finished(s, world.alice, jobs_dir, older_than=timedelta(days=7))
    assert ids == [old_a] and freed == 3000
    assert (jobs_dir / str(new_a)).exists() and (jobs_dir / str(old_b)).exists()


def test_retention_removes_folders_past_the_setting_and_zero_keeps_all(sessions, tmp_path):
    world, jobs_dir = populate(sessions), tmp_path / "jobs"
    old = finished(sessions, world.alice, tmp_path, jobs_dir, state="cancelled", days_ago=31)
    young = finished(sessions, world.bob, tmp_path, jobs_dir, days_ago=29)
    assert retention.apply_retention(sessions, jobs_dir, days=0) == []
    assert retention.apply_retention(sessions, jobs_dir, days=30) == [old]
    assert not (jobs_dir / str(old)).exists() and (jobs_dir / str(young)).exists()
    assert retention.apply_retention(sessions, jobs_dir, days=30) == []
