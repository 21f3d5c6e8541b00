"""Jobs' environments as the control plane manages them (envs/service.py), on SQLite and
PostgreSQL: listed per tenant, removed, evicted least recently used first, never one in use or
being built; builds that died are swept."""

import fcntl
import json
import os
import time

import pytest

from deeppod.envs import build, images, service
from deeppod.errors import Conflict, Forbidden, NotFound
from deeppod.store.models import Job
from tests.fixtures import populate, submit_job
from tests.helpers import image_archive


def made(root, tenant_id, key, size, used_ago):
    path = root / str(tenant_id) / key
    path.mkdir(parents=True)
    (path / "blob").write_bytes(os.urandom(size))
    build.ready_file(path).write_text(json.dumps({"key": key, "requirements": [f"{key}==1"], "built_at": 1.0}))
    build.used_file(path).touch()
    t = time.time() - used_ago
    os.utime(build.used_file(path), (t, t))
    return path


def test_each_tenant_sees_its_own_and_an_admin_all(sessions, tmp_path):
    world = populate(sessions)
    made(tmp_path, world.alice.tenant_id, "aaa", 1000, 10)
    made(tmp_path, world.bob.tenant_id, "bbb", 1000, 20)
    with sessions() as s:
        assert [e.key for e in service.list_envs(s, world.alice, tmp_path)] == ["aaa"]
        assert [e.tenant for e in service.list_envs(s, world.alice, tmp_path)] == ["a"]
        assert [e.key for e in service.list_envs(s, world.admin, tmp_path)] == ["aaa", "bbb"]  # newest use first
        with pytest.raises(NotFound):
            service.remove(s, world.alice, tmp_path, "bbb")  # another tenant's: as if it did not exist


def test_one_in_use_or_being_built_is_not_removed(sessions, tmp_path):
    world = populate(sessions)
    path = made(tmp_path, world.alice.tenant_id, "aaa", 1000, 10)
    job_id = submit_job(sessions, world.alice, tmp_path, gpus_per_worker=0)
    with sessions.begin() as s:
        s.get(Job, job_id).env_key = "aaa"  # queued: it will start in it
    with sessions() as s, pytest.raises(Conflict, match=f"active job.*{job_id}"):
        service.remove(s, world.alice, tmp_path, "aaa")
    with sessions.begin() as s:
        s.get(Job, job_id).state = "succeeded"
    with open(path.parent / "aaa.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a job finding or building it right now
        with sessions() as s, pytest.raises(Conflict, match="right now"):
            service.remove(s, world.alice, tmp_path, "aaa")
        fcntl.flock(lock, fcntl.LOCK_UN)
    with sessions() as s:
        assert service.remove(s, world.alice, tmp_path, "aaa").key == "aaa"
    assert not path.exists()


def test_over_the_cap_the_least_recently_used_go_first(sessions, tmp_path):
    world = populate(sessions)
    made(tmp_path, world.alice.tenant_id, "old", 100_000, 3000)
    made(tmp_path, world.alice.tenant_id, "mid", 100_000, 2000)
    made(tmp_path, world.bob.tenant_id, "new", 100_000, 10)
    made(tmp_path, world.bob.tenant_id, "used", 100_000, 5000)  # the oldest, but a running job has it
    job_id = submit_job(sessions, world.bob, tmp_path, gpus_per_worker=0)
    with sessions.begin() as s:
        s.get(Job, job_id).env_key = "used"
    with sessions() as s:
        assert service.prune(s, tmp_path, 250_000) == ["old", "mid"]
        assert sorted(e.key for e in service.list_envs(s, world.admin, tmp_path)) == ["new", "used"]
        assert service.prune(s, tmp_path, 0) == ["new"]
        with pytest.raises(Exception, match="admin"):
            service.prune(s, tmp_path, 0, world.alice)


def test_builds_that_died_are_swept_and_live_ones_kept(sessions, tmp_path):
    populate(sessions)
    dead = tmp_path / "2" / ".staging-k1-123"
    live = tmp_path / "2" / ".staging-k2-456"
    for p in (dead, live):
        p.mkdir(parents=True)
        os.utime(p, (time.time() - 3600, time.time() - 3600))
    with open(tmp_path / "2" / "k2.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # its builder is alive
        with sessions() as s:
            service.prune(s, tmp_path, 10**12)
        fcntl.flock(lock, fcntl.LOCK_UN)
    assert not dead.exists() and live.exists()


@pytest.mark.slow  # it starts processes
def test_an_unpacked_image_is_shared_listed_for_all_and_removed_by_an_admin(sessions, tmp_path):
    world = populate(sessions)
    image = tmp_path / "images" / "img1"
    image.mkdir(parents=True)
    (image / "blob").write_bytes(os.urandom(2000))
    images.ready_file(image).write_text(json.dumps({"key": "img1", "image": "tiny", "bytes": 2000, "built_at": 1.0}))
    made(tmp_path, world.alice.tenant_id, "aaa", 1000, 10)
    with sessions() as s:
        seen = {e.key: (e.tenant, e.image) for e in service.list_envs(s, world.alice, tmp_path)}
        assert seen == {"aaa": ("a", None), "img1": (service.SHARED, "tiny")}
        with pytest.raises(Forbidden):
            service.remove(s, world.alice, tmp_path, "img1")  # every tenant's jobs use it
        assert service.prune(s, tmp_path, 5000, world.admin) == ["img1"]  # least recently used first
    assert not image.exists()
    offered = tmp_path / "offered"
    offered.mkdir()
    image_archive(offered, "tiny")
    assert [(i.name, i.unpacked) for i in service.list_images(tmp_path, str(offered))] == [("tiny", False)]
    assert service.list_images(tmp_path, None) == []
