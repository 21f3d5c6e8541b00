"""Tenants' job folders against the plan's storage quotas, and the plan's per-worker process
limits (jobs/quotas.py), through the store on SQLite and PostgreSQL."""

import os

import pytest
from sqlalchemy import select

from deeppod.envs.service import tenant_bytes
from deeppod.errors import Forbidden, InvalidRequest
from deeppod.jobs import quotas
from deeppod.plans.service import apply_plan
from deeppod.store.models import Job, JobEvent, Node, Tenant, utcnow
from tests.fixtures import populate, submit_job

KB = 1000


def plan(sessions, world, **a):
    with sessions.begin() as s:
        apply_plan(s, world.admin, {"tenants": [{"name": "a", "guaranteed": 0, **a}, {"name": "b", "guaranteed": 0}]})


def write(folder, name, size):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(os.urandom(size))


def test_a_tenant_over_its_quota_cannot_submit_and_its_writing_jobs_fail_with_the_reason(sessions, tmp_path):
    world, jobs_dir = populate(sessions), tmp_path / "jobs"
    plan(sessions, world, storage_gb=0.0001)  # 100 kB
    writer = submit_job(sessions, world.alice, tmp_path, gpus_per_worker=0)
    quiet = submit_job(sessions, world.alice, tmp_path, gpus_per_worker=0)
    other = submit_job(sessions, world.bob, tmp_path, gpus_per_worker=0)
    with sessions.begin() as s:
        for job_id in (writer, quiet, other):
            s.get(Job, job_id).state = "running"
    meter = quotas.StorageMeter(sessions, jobs_dir)
    write(jobs_dir / str(writer) / "checkpoints", "a", 40 * KB)
    write(jobs_dir / str(quiet) / "outputs", "b", 40 * KB)
    write(jobs_dir / str(other) / "outputs", "c", 400 * KB)  # tenant b has no quota
    used = meter.tick()
    assert 80 * KB <= used["a"] < 100 * KB and used["b"] >= 400 * KB
    submit_job(sessions, world.alice, tmp_path, gpus_per_worker=0)  # under: fine
    write(jobs_dir / str(writer) / "checkpoints", "d", 60 * KB)  # the writer goes over
    meter.tick()
    with sessions() as s:
        assert s.scalar(select(Tenant.storage_bytes).where(Tenant.name == "a")) > 100 * KB
        job, calm, theirs = s.get(Job, writer), s.get(Job, quiet), s.get(Job, other)
        assert job.stop_as == "failed" and "over the plan's storage quota of 0.0001 GB" in job.stop_reason
        assert "deeppod jobs purge" in job.stop_reason
        assert calm.stop_reason is None and theirs.stop_reason is None  # wrote nothing since / not over
        assert s.scalar(select(JobEvent.kind).where(JobEvent.job_id == writer)
                        .order_by(JobEvent.id.desc()).limit(1)) == "stop-requested"
    with pytest.raises(Forbidden, match="storage quota") as refused:
        submit_job(sessions, world.alice, tmp_path, gpus_per_worker=0)
    assert refused.value.code == "over_quota"
    submit_job(sessions, world.bob, tmp_path, gpus_per_worker=0)  # another tenant is not held back


def test_a_parents_quota_counts_its_sub_tenants_and_links_count_nothing(sessions, tmp_path):
    world, jobs_dir = populate(sessions), tmp_path / "jobs"
    with sessions.begin() as s:
        apply_plan(s, world.admin, {"tenants": [{"name": "lab", "guaranteed": 0, "storage_gb": 0.0001, "children": [
            {"name": "a", "guaranteed": 0}, {"name": "b", "guaranteed": 0}]}]})
    ja = submit_job(sessions, world.alice, tmp_path, gpus_per_worker=0)
    jb = submit_job(sessions, world.bob, tmp_path, gpus_per_worker=0)
    big = tmp_path / "big"
    big.write_bytes(os.urandom(500 * KB))
    write(jobs_dir / str(ja) / "outputs", "x", 60 * KB)
    os.symlink(big, jobs_dir / str(ja) / "outputs" / "link")  # not its disk
    meter = quotas.StorageMeter(sessions, jobs_dir)
    meter.tick()
    submit_job(sessions, world.bob, tmp_path, gpus_per_worker=0)
    write(jobs_dir / str(jb) / "outputs", "y", 60 * KB)
    meter.tick()
    for who in (world.alice, world.bob):
        with pytest.raises(Forbidden, match="'lab' and its tenants"):
            submit_job(sessions, who, tmp_path, gpus_per_worker=0)


def test_finished_jobs_are_measured_once_and_purged_ones_drop_out(sessions, tmp_path):
    world, jobs_dir = populate(sessions), tmp_path / "jobs"
    job_id = submit_job(sessions, world.alice, tmp_path, gpus_per_worker=0)
    with sessions.begin() as s:
        s.get(Job, job_id).state = "succeeded"
    write(jobs_dir / str(job_id), "log", 50 * KB)
    meter = quotas.StorageMeter(sessions, jobs_dir)
    first = meter.tick()["a"]
    write(jobs_dir / str(job_id), "more", 50 * KB)  # nothing writes a finished job's folder: kept as measured
    assert meter.tick()["a"] == first
    with sessions.begin() as s:
        s.get(Job, job_id).purged_at = utcnow()
    assert meter.tick().get("a", 0) == 0 and job_id not in meter.final


def test_processes_per_worker_come_from_the_job_then_the_plan_then_the_server(sessions, tmp_path):
    world = populate(sessions)
    own = submit_job(sessions, world.alice, tmp_path, gpus_per_worker=0, pids_per_worker=100)
    plain = submit_job(sessions, world.alice, tmp_path, gpus_per_worker=0)
    with pytest.raises(InvalidRequest, match="at least 16"):
        submit_job(sessions, world.alice, tmp_path, gpus_per_worker=0, pids_per_worker=4)
    with sessions() as s:
        assert quotas.pids_for(s, s.get(Job, own), "a", 4096) == 100
        assert quotas.pids_for(s, s.get(Job, plain), "a", 4096) == 4096
    # where the plan says nothing, the server's default bounds what a member may ask (issue 70)
    with pytest.raises(Forbidden, match=r"this server \(DEEPPOD_PIDS_PER_WORKER\) lets tenant 'a'.* at most 4096"):
        submit_job(sessions, world.alice, tmp_path, gpus_per_worker=0, pids_per_worker=4194304)
    plan(sessions, world, pids_per_worker=512)
    with pytest.raises(Forbidden, match="the plan lets tenant 'a'.* at most 512") as refused:
        submit_job(sessions, world.alice, tmp_path, gpus_per_worker=0, pids_per_worker=1000)
    assert refused.value.status == 403 and refused.value.code == "over_limit"
    with sessions() as s:
        assert quotas.pids_for(s, s.get(Job, plain), "a", 4096) == 512
        assert quotas.pids_for(s, s.get(Job, own), "a", 4096) == 100
        assert quotas.pids_for(s, s.get(Job, plain), "b", 4096) == 4096  # b has no cap


def test_what_a_member_asks_for_each_worker_is_bounded_by_its_plan(sessions, tmp_path):
    """Memory, CPUs and GPU memory (issue 70): above the plan's cap (the tightest on the tenant's
    path) is a 403 that names it; where the plan says nothing, the nodes bound it."""
    world = populate(sessions)
    with sessions.begin() as s:
        apply_plan(s, world.admin, {"tenants": [
            {"name": "org", "guaranteed": 0, "memory_gb_per_worker": 8, "children": [
                {"name": "a", "guaranteed": 0, "memory_gb_per_worker": 2, "cpus_per_worker": 1.5,
                 "gpu_memory_gb": 24}]},
            {"name": "b", "guaranteed": 0}]})
    for ask, words in (({"memory_mb_per_worker": 2049}, r"at most 2 GiB of memory per worker \(this one asks 2\.0"),
                       ({"cpus_per_worker": 2}, r"at most 1\.5 CPUs per worker .*--cpus-per-worker"),
                       ({"gpu_memory_mb": 40 * 1024}, r"at most 24 GiB of memory on each GPU .*gpu_memory_gb")):
        with pytest.raises(Forbidden, match=words) as refused:
            submit_job(sessions, world.alice, tmp_path, gpus_per_worker=0, **ask)
        assert refused.value.status == 403 and refused.value.code == "over_limit"
    ok = submit_job(sessions, world.alice, tmp_path, gpus_per_worker=0, memory_mb_per_worker=2048, cpus_per_worker=1.5)
    submit_job(sessions, world.bob, tmp_path, gpus_per_worker=0, memory_mb_per_worker=4096, cpus_per_worker=2)
    with sessions() as s:
        assert s.get(Job, ok).memory_mb_per_worker == 2048


def test_a_workers_memory_is_its_ask_else_its_plans_cap_else_what_its_node_offers(sessions, tmp_path):
    world = populate(sessions)
    own = submit_job(sessions, world.alice, tmp_path, gpus_per_worker=0, memory_mb_per_worker=3000)
    plain = submit_job(sessions, world.alice, tmp_path, gpus_per_worker=0)
    with sessions() as s:
        nodes = {n.name: n.memory_mb for n in s.scalars(select(Node))}
        assert quotas.memory_for(s, s.get(Job, own), "a", set(nodes)) == 3000
        assert quotas.memory_for(s, s.get(Job, plain), "a", set(nodes)) == min(nodes.values()) == 16384
        assert quotas.memory_for(s, s.get(Job, plain), "a", {"gone"}) is None  # no such node: nothing to ask
    plan(sessions, world, memory_gb_per_worker=2)  # lowered below a queued job's ask since
    with sessions() as s:
        assert quotas.memory_for(s, s.get(Job, own), "a", set(nodes)) == 2048
        assert quotas.memory_for(s, s.get(Job, plain), "a", set(nodes)) == 2048


def test_plan_limits_are_checked(sessions):
    world = populate(sessions)
    for bad, words in (({"pids_per_worker": 8}, "at least 16"), ({"storage_gb": -1}, "must not be negative"),
                       ({"storage_gb": "lots"}, "must be a number"), ({"memory_gb_per_worker": 0}, "more than 0"),
                       ({"cpus_per_worker": -1}, "must not be negative"), ({"gpu_memory_gb": "big"}, "a number")):
        with pytest.raises(InvalidRequest, match=words), sessions.begin() as s:
            apply_plan(s, world.admin, {"tenants": [{"name": "a", "guaranteed": 0, **bad}]})
    with sessions() as s:
        assert s.get(Tenant, world.alice.tenant_id).storage_bytes is None


def test_a_tenants_python_environments_count_against_its_quota(sessions, tmp_path):
    world, envs_root = populate(sessions), tmp_path / "envs"
    plan(sessions, world, storage_gb=0.0001)  # 100 kB
    for tenant_id, key, size in ((world.alice.tenant_id, "k1", 70 * KB), (world.alice.tenant_id, "k2", 50 * KB),
                                 (world.bob.tenant_id, "k3", 500 * KB)):
        (envs_root / str(tenant_id) / key).mkdir(parents=True, exist_ok=True)
        (envs_root / str(tenant_id) / f"{key}.json").write_text(f'{{"key": "{key}", "bytes": {size}}}')
    (envs_root / "images" / "i1").mkdir(parents=True)
    (envs_root / "images" / "i1.json").write_text('{"bytes": 9000000}')  # shared: nobody's
    assert tenant_bytes(envs_root) == {world.alice.tenant_id: 120 * KB, world.bob.tenant_id: 500 * KB}
    used = quotas.StorageMeter(sessions, tmp_path / "jobs", envs_root).tick()
    assert used["a"] == 120 * KB and used["b"] == 500 * KB
    with pytest.raises(Forbidden, match="environments of tenant 'a'.*deeppod envs rm"):
        submit_job(sessions, world.alice, tmp_path, gpus_per_worker=0)


def test_the_package_indexes_a_job_names_must_be_the_plans(sessions, tmp_path):
    world = populate(sessions)
    reqs = "--extra-index-url https://pkgs.example.com/simple\nnumpy==2.1.0"
    with pytest.raises(Forbidden, match="does not let tenant 'a'.*https://pkgs.example.com/simple") as refused:
        submit_job(sessions, world.alice, tmp_path, gpus_per_worker=0, requirements=reqs)
    assert refused.value.code == "index_not_allowed"
    with sessions.begin() as s:
        apply_plan(s, world.admin, {"tenants": [
            {"name": "lab", "guaranteed": 0, "package_indexes": ["https://pkgs.example.com/simple/"],
             "children": [{"name": "a", "guaranteed": 0}]}, {"name": "b", "guaranteed": 0}]})
    job_id = submit_job(sessions, world.alice, tmp_path, gpus_per_worker=0, requirements=reqs)  # its parent allows it
    with sessions() as s:
        assert s.get(Job, job_id).requirements == "--extra-index-url https://pkgs.example.com/simple\nnumpy==2.1.0"
    with pytest.raises(Forbidden, match="does not let tenant 'b'"):
        submit_job(sessions, world.bob, tmp_path, gpus_per_worker=0, requirements=reqs)
    with sessions.begin() as s, pytest.raises(InvalidRequest, match="package_indexes must be a list of http"):
        apply_plan(s, world.admin, {"tenants": [{"name": "a", "guaranteed": 0, "package_indexes": ["file:///etc"]}]})
