"""Monitoring with the fake samplers, on SQLite and PostgreSQL: attribution to jobs and
tenants, the idle-GPUs event, an ECC or Xid fault cordoning the GPU and requeueing its job,
storage bounded by roll-ups and retention."""

import pytest
from sqlalchemy import select

from deeppod.cluster.readings import FakeGpuSampler, FakeHostSampler, OneNode
from deeppod.errors import NotFound
from deeppod.executor.fake import FakeExecutor
from deeppod.executor.usage import Usage
from deeppod.jobs.controller import JobController
from deeppod.jobs.service import get_job, list_events
from deeppod.monitor import service
from deeppod.monitor.loop import Monitor
from deeppod.store.models import GpuSample, HostSample, Job, Node
from tests.fixtures import populate, submit_job


class Clock:
    def __init__(self, t=1_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


@pytest.fixture
def world(sessions, tmp_path):
    w = populate(sessions)
    jobs = JobController(sessions, FakeExecutor(), jobs_dir=tmp_path / "jobs", api_url="http://127.0.0.1:1",
                         server_env={"PATH": "/usr/bin"})
    clock = Clock()
    gpus = FakeGpuSampler(4)
    node = _node_name(sessions)
    mon = Monitor(sessions, OneNode(node, gpus, FakeHostSampler()), service.Policy(idle_after_s=1800), clock=clock)
    return w, jobs, mon, gpus, clock, tmp_path


def _node_name(sessions):
    with sessions() as s:
        return s.scalar(select(Node.name))


def _events(sessions, who, job_id):
    with sessions() as s:
        return [(e.kind, e.message) for e in list_events(s, who, job_id)]


def test_samples_are_tied_to_the_job_and_tenant_holding_each_gpu(sessions, world):
    w, jobs, mon, gpus, clock, tmp = world
    a = submit_job(sessions, w.alice, tmp, workers=2, gpus_per_worker=1)
    b = submit_job(sessions, w.bob, tmp, gpus_per_worker=1)
    jobs.tick()
    for i in range(4):
        gpus.set(i, util=10.0 * (i + 1), memory_used_mb=100.0 * i)
    mon.tick()
    with sessions() as s:
        rows = {r.gpu: r for r in s.scalars(select(GpuSample))}
        held = {(w_["gpus"][0]): j.id for j in s.scalars(select(Job)) for w_ in j.placed_workers}
        assert {g: r.job_id for g, r in rows.items()} == {g: held.get(g) for g in range(4)}
        assert {r.tenant_id for r in rows.values() if r.job_id == b} == {w.bob.tenant_id}
        assert s.scalar(select(HostSample)).cpu_percent == 10.0
        usage = service.usage_of(s, get_job(s, w.alice, a))
        assert len(usage["gpus"]) == 2 and usage["mean_util_5m"] is not None
        # alice sees bob's GPU as busy, not whose
        seen = service.latest(s, w.alice, 60, clock())
        assert {r["job_id"] for r in seen if r["busy"]} == {a, None}
        assert {r["job_id"] for r in service.latest(s, w.admin, 60, clock()) if r["busy"]} == {a, b}
        with pytest.raises(NotFound, match=f"no job with id {b}"):  # another tenant's: as if missing
            service.usage_of(s, get_job(s, w.alice, b))


def test_a_job_idle_on_its_gpus_for_30_minutes_gets_one_event(sessions, world):
    w, jobs, mon, gpus, clock, tmp = world
    a = submit_job(sessions, w.alice, tmp, workers=2, gpus_per_worker=1)
    busy = submit_job(sessions, w.alice, tmp, gpus_per_worker=1)
    jobs.tick()
    with sessions() as s:
        busy_gpu = s.get(Job, busy).placed_workers[0]["gpus"][0]
    gpus.set(busy_gpu, util=90.0)
    for _ in range(4 * 40):  # 40 minutes of 15 s samples
        mon.tick()
        clock.t += 15
    idle = [e for e in _events(sessions, w.alice, a) if e[0] == "idle-gpus"]
    assert len(idle) == 1 and "under 5% utilization for 30 minutes" in idle[0][1]
    assert not [e for e in _events(sessions, w.alice, busy) if e[0] == "idle-gpus"]
    with sessions() as s:
        assert s.get(Job, a).idle_since is not None and s.get(Job, busy).idle_since is None
    with sessions() as s:  # idle jobs are the first victims only when the plan asks
        snap = jobs.snapshot(s)
        assert not any(r.reclaim_first for r in snap.running)
    from deeppod.plans.service import apply_plan
    with sessions.begin() as s:
        apply_plan(s, w.admin, {"tenants": [], "reclaim_idle_first": True})
    with sessions() as s:
        assert {r.id for r in jobs.snapshot(s).running if r.reclaim_first} == {a}


@pytest.mark.parametrize("fault, words", [({"ecc_uncorrected": 2}, "2 uncorrectable ECC errors"),
                                          ({"xid": 79}, "Xid 79 error")])
def test_a_gpu_with_hardware_errors_is_cordoned_and_its_job_requeued(sessions, world, fault, words):
    w, jobs, mon, gpus, clock, tmp = world
    a = submit_job(sessions, w.alice, tmp, gpus_per_worker=1, max_restarts=0)
    jobs.tick()
    with sessions() as s:
        gpu = s.get(Job, a).placed_workers[0]["gpus"][0]
    mon.tick()
    gpus.set(gpu, **fault)
    clock.t += 5
    mon.tick()
    with sessions() as s:
        node = s.scalar(select(Node))
        assert [g["healthy"] for g in node.gpus if g["index"] == gpu] == [False]
    jobs.tick()  # the scheduler preempts the job on the sick GPU...
    jobs.tick()  # ...its workers are gone: it requeues, and starts again on another GPU
    jobs.tick()
    with sessions() as s:
        job = s.get(Job, a)
        assert job.state == "running" and job.placed_workers[0]["gpus"][0] != gpu
    kinds = [k for k, m in _events(sessions, w.alice, a)]
    assert "gpu-fault" in kinds and "requeued" in kinds
    assert words in dict(_events(sessions, w.alice, a))["gpu-fault"]
    clock.t += 5
    mon.tick()  # the count stays at 2: nothing new
    assert [k for k, _ in _events(sessions, w.alice, a)].count("gpu-fault") == 1 or fault.get("xid")


def test_storage_is_bounded_by_rollups_and_retention(sessions, world):
    w, jobs, mon, gpus, clock, tmp = world
    mon.policy = service.Policy(raw_keep_s=300, rollup_s=60, retention_s=1200)
    import deeppod.monitor.loop as loop
    counts = []
    for i in range(12 * 60):  # an hour at a 5 s period
        mon.tick()
        clock.t += 5
        if i % 240 == 239:
            with sessions() as s:
                counts.append(service.count_rows(s))
    bound = 4 * (300 / 5 + loop.COMPACT_EVERY_S / 5 + 1200 / 60 + 2)  # raw, raw awaiting a roll-up, buckets
    assert all(c["gpu_samples"] <= bound for c in counts), counts
    assert counts[-1]["gpu_samples"] == counts[-2]["gpu_samples"]  # steady, not growing
    with sessions() as s:
        periods = {p for (p,) in s.execute(select(GpuSample.period).distinct())}
        oldest = min(a for (a,) in s.execute(select(GpuSample.at)))
    assert periods == {0, 60} and oldest >= clock() - 1200 - 60
    assert loop.COMPACT_EVERY_S == 60.0


def test_a_running_jobs_cpu_and_memory_are_sampled_and_read_back_as_cores_and_mib(sessions, world):
    w, jobs, mon, gpus, clock, tmp = world
    executor = jobs.executor
    mon.usage = executor.usage  # as the server wires it
    a = submit_job(sessions, w.alice, tmp, gpus_per_worker=1)
    jobs.tick()
    for seconds, mb in ((10.0, 500.0), (20.0, 520.0), (22.5, 510.0), (1.0, 300.0)):  # the last: a new run
        executor.used[a] = Usage(seconds, mb)
        mon.tick()
        clock.t += 5
    executor.used.pop(a)  # ended: nothing to read, nothing recorded
    mon.tick()
    with sessions() as s:
        u = service.usage_of(s, get_job(s, w.alice, a))
    t0 = 1_000_000.0
    assert u["cpu"] == [[t0 + 5, 2.0], [t0 + 10, 0.5]]  # 10 CPU-seconds in 5 s: 2 cores; no point across runs
    assert u["memory_mb"] == [[t0, 500.0], [t0 + 5, 520.0], [t0 + 10, 510.0], [t0 + 15, 300.0]]
    with sessions() as s:
        assert service.usage_of(s, get_job(s, w.alice, a), max_points=2)["memory_mb"] == [[t0 + 10, 510.0],
                                                                                   [t0 + 15, 300.0]]
        with pytest.raises(NotFound):
            service.usage_of(s, get_job(s, w.bob, a))
    with sessions.begin() as s:  # samples go with the monitor's retention
        service.compact(s, clock() + mon.policy.retention_s + 60, mon.policy)
    with sessions() as s:
        assert service.count_rows(s)["job_samples"] == 0
