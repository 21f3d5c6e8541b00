"""Starting workers (jobs/launch.py): what an installation names on the shared host is its own,
so two DeepPod servers on one machine never share a tenant's OS user or a job's shared memory;
and no link planted in a job's folders or its shared memory is followed by the server."""

import os

import pytest

from deeppod.auth.identities import FakeIdentities, tenant_identity
from deeppod.jobs.launch import Isolation, shm_name
from deeppod.settings import Settings
from deeppod.store.models import Tenant
from tests.fixtures import populate


def test_two_installations_on_one_host_name_their_tenants_and_shared_memory_apart(tmp_path):
    a, b = Settings(home=tmp_path / "a").instance, Settings(home=tmp_path / "b").instance
    assert a != b and a == Settings(home=tmp_path / "a").instance  # stable across restarts of one home
    ia, ib = Isolation(FakeIdentities(), (), instance=a), Isolation(FakeIdentities(), (), instance=b)
    assert ia.user_prefix != ib.user_prefix and shm_name(a, 1) != shm_name(b, 1)
    assert len(f"{ia.user_prefix}{10**9}") <= 32  # Linux user names end at 32 characters


def test_a_home_made_again_at_the_same_path_is_a_new_installation(tmp_path):
    """Issue 70: a home re-created at the same path reused the old installation's OS users (and
    so the uids that own its files); an installation from before the id keeps its names."""
    import hashlib
    import shutil

    home = tmp_path / "home"
    first = Settings(home=home).instance
    assert first == Settings(home=home).instance  # stable across restarts of one home
    shutil.rmtree(home)
    assert Settings(home=home).instance != first
    old = tmp_path / "old"
    old.mkdir()
    (old / "deeppod.db").write_bytes(b"")  # made by a server from before installation ids
    assert Settings(home=old).instance == hashlib.sha256(str(old.resolve()).encode()).hexdigest()[:8]


@pytest.mark.slow  # it starts useradd and userdel
@pytest.mark.skipif(os.geteuid() != 0, reason="making OS users needs root")
def test_uninstalling_removes_the_installations_tenant_users_and_no_other():
    import pwd
    import subprocess

    from deeppod.auth.identities import SystemIdentities, remove_users

    prefix = f"deeppod-zz{os.getpid() % 100000}-t"
    made = SystemIdentities().ensure(prefix + "1")
    subprocess.run(["useradd", "--system", "--no-create-home", prefix + "2"], check=True)  # not one DeepPod made
    try:
        assert remove_users(prefix) == [made.user]
        names = {pw.pw_name for pw in pwd.getpwall()}
        assert made.user not in names and prefix + "2" in names
    finally:
        for name in (prefix + "1", prefix + "2"):
            subprocess.run(["userdel", name], capture_output=True)


def test_a_tenant_keeps_the_os_user_it_was_given(sessions):
    world = populate(sessions)
    ids = FakeIdentities()
    with sessions.begin() as s:
        tenant_id = s.get(Tenant, world.alice.tenant_id).id
        first = tenant_identity(s, ids, tenant_id, "deeppod-0123abcd-t")
    assert first.user == f"deeppod-0123abcd-t{tenant_id}"
    with sessions.begin() as s:  # recorded: another prefix later (an older server's) does not rename it
        again = tenant_identity(s, ids, tenant_id, "deeppod-t")
        assert again == first and s.get(Tenant, tenant_id).os_user == first.user


def _launcher(tmp_path):
    from deeppod.executor.fake import FakeExecutor
    from deeppod.jobs.launch import Launcher

    shm = tmp_path / "shm"
    shm.mkdir()
    os.chmod(shm, 0o1777)  # like /dev/shm: anyone on the host may make names there
    return Launcher(FakeExecutor(), jobs_dir=tmp_path / "jobs", api_url="http://127.0.0.1:1", base_env={},
                    isolation=Isolation(FakeIdentities(), (), instance="0123abcd", shm_root=str(shm)))


def _start(sessions, launcher, job_id):
    from sqlalchemy import select

    from deeppod.scheduler import WorkerPlacement
    from deeppod.store.models import Job, Node

    with sessions.begin() as s:
        node = s.scalars(select(Node)).first()
        return launcher.launch_spec(s, s.get(Job, job_id), [WorkerPlacement(0, node.name, (), 1.0, 0)], {})


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_working_directory_made_a_link_after_submit_is_not_started(sessions, tmp_path):
    from deeppod.errors import ExecutorError
    from tests.fixtures import submit_job

    world = populate(sessions)
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    job_id = submit_job(sessions, world.alice, work)
    launcher = _launcher(tmp_path)
    spec = _start(sessions, launcher, job_id)
    assert [str(work), str(work), True] in spec.sandbox["binds"]
    work.rmdir()
    os.symlink(elsewhere, work)  # an earlier job of the tenant, with the parent folder bound, did this
    with pytest.raises(ExecutorError, match="no longer the folder"):
        _start(sessions, launcher, job_id)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_jobs_shared_memory_is_left_to_its_supervisor_and_a_planted_link_to_no_one(sessions, tmp_path):
    """The server makes nothing at the job's /dev/shm path: its supervisor mounts the job's own
    tmpfs there (executor/job_shm.py, tested with real mounts); a link planted there is followed
    by no one, and removed only as a link."""
    from tests.fixtures import submit_job

    world = populate(sessions)
    (tmp_path / "work").mkdir()
    job_id = submit_job(sessions, world.alice, tmp_path / "work")
    launcher = _launcher(tmp_path)
    target = tmp_path / "etc"
    target.mkdir()
    (target / "keep").write_text("x")
    os.symlink(target, launcher.shm(job_id))  # another user of the host, before the job starts
    spec = _start(sessions, launcher, job_id)
    assert spec.sandbox["shm"] == str(launcher.shm(job_id)) and target.stat().st_uid == 0
    launcher.remove_shm(job_id)  # as the job ends
    assert (target / "keep").read_text() == "x" and os.path.islink(launcher.shm(job_id))


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_workers_limits_carry_its_memory_cpus_and_processes(sessions, tmp_path):
    from dataclasses import replace

    from deeppod.plans.service import apply_plan
    from tests.fixtures import submit_job

    world = populate(sessions)
    (tmp_path / "work").mkdir()
    job_id = submit_job(sessions, world.alice, tmp_path / "work", gpus_per_worker=0, cpus_per_worker=1.5,
                        memory_mb_per_worker=700)
    launcher = _launcher(tmp_path)
    assert "limits" not in _start(sessions, launcher, job_id).sandbox  # the host's groups unusable: polled
    launcher.isolation = replace(launcher.isolation, cgroups=True, cpu_quota=True, pids=2048)
    assert _start(sessions, launcher, job_id).sandbox["limits"] == {"memory_mb": 700, "cpus": 1.5, "cpu_quota": True,
                                                                   "pids": 2048}
    plain = submit_job(sessions, world.alice, tmp_path / "work", gpus_per_worker=0)
    assert _start(sessions, launcher, plain).sandbox["limits"]["memory_mb"] == 16384  # what the node offers, not all
    with sessions.begin() as s:
        apply_plan(s, world.admin, {"tenants": [{"name": "a", "guaranteed": 0, "pids_per_worker": 256,
                                                 "memory_gb_per_worker": 0.5}]})
    assert _start(sessions, launcher, job_id).sandbox["limits"]["pids"] == 256
    assert _start(sessions, launcher, job_id).sandbox["limits"]["memory_mb"] == 512
    assert _start(sessions, launcher, plain).sandbox["limits"]["memory_mb"] == 512
