"""Submitting, listing, showing and cancelling jobs, on SQLite and PostgreSQL."""

import sys

import pytest
from sqlalchemy import func, select

from deeppod.contract import FINAL_STATES, MOVES, JobState
from deeppod.errors import Conflict, InvalidRequest, NotFound
from deeppod.job_spec import JobSpec
from deeppod.jobs import service
from deeppod.store.models import Job, JobEvent
from tests.fixtures import populate


def req(tmp_path, **kw):
    args = dict(command=[sys.executable, "-c", "print(1)"], workdir=str(tmp_path))
    args.update(kw)
    return JobSpec(**args)


BAD = [
    (dict(command=[]), "no command"),
    (dict(command=["no-such-program-xyz"]), "was not found"),
    (dict(command=["./missing.sh"]), "does not exist"),
    (dict(workdir="/no/such/dir"), "does not exist"),
    (dict(workdir="relative/dir"), "absolute"),
    (dict(workers=0), "at least 1"),
    (dict(workers=3, gpus_per_worker=2), "whole cluster has 4"),
    (dict(gpus_per_worker=-1), "0 or more"),
    (dict(cpus_per_worker=0), "more than 0"),
    (dict(cpus_per_worker=9), "largest node has 8"),
    (dict(memory_mb_per_worker=1 << 30), "memory"),
    (dict(env={"RANK": "3"}), "set by DeepPod"),
    (dict(env={"DEEPPOD_TOKEN": "x"}), "set by DeepPod"),
    (dict(env={"1BAD": "x"}), "not valid"),
    (dict(grace_seconds=99999), "grace_seconds"),
]


@pytest.mark.parametrize("change,message", BAD, ids=[m for _, m in BAD])
def test_bad_input_is_refused_and_nothing_is_written(sessions, tmp_path, change, message):
    world = populate(sessions)
    with pytest.raises(InvalidRequest, match=message):
        with sessions.begin() as s:
            service.submit(s, world.alice, req(tmp_path, **change), default_grace=30)
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 0
        assert s.scalar(select(func.count()).select_from(JobEvent)) == 0


def test_non_executable_script_path_is_explained(sessions, tmp_path):
    world = populate(sessions)
    (tmp_path / "run.sh").write_text("echo hi\n")
    with pytest.raises(InvalidRequest, match="chmod"):
        with sessions.begin() as s:
            service.submit(s, world.alice, req(tmp_path, command=["./run.sh"]), default_grace=30)


def test_submit_list_show_cancel_and_tenant_scoping(sessions, tmp_path):
    world = populate(sessions)
    with sessions.begin() as s:
        a = service.submit(s, world.alice, req(tmp_path, name="a1"), default_grace=30)
        b = service.submit(s, world.bob, req(tmp_path, name="b1", grace_seconds=2), default_grace=30)
    assert a.state == "queued" and a.grace_seconds == 30 and b.grace_seconds == 2
    with sessions.begin() as s:
        assert [j.name for j, _, _ in service.list_jobs(s, world.alice)] == ["a1"]
        assert {j.name for j, _, _ in service.list_jobs(s, world.admin)} == {"a1", "b1"}
        assert service.get_job(s, world.admin, b.id).name == "b1"
        with pytest.raises(NotFound, match=f"no job with id {b.id}"):  # another tenant's: as if missing
            service.get_job(s, world.alice, b.id)
        with pytest.raises(NotFound):
            service.cancel(s, world.alice, b.id)
        with pytest.raises(NotFound):
            service.get_job(s, world.alice, 9999)
        with pytest.raises(InvalidRequest):
            service.list_jobs(s, world.alice, service.JobFilter(state="bogus"))
        job = service.cancel(s, world.alice, a.id)
        assert job.state == "cancelled" and job.ended_at is not None
    with sessions.begin() as s:
        with pytest.raises(Conflict):
            service.cancel(s, world.alice, a.id)
        kinds = [e.kind for e in service.list_events(s, world.alice, a.id)]
        assert kinds == ["queued", "cancelled"]


def test_list_filters_by_kind_tenant_user_and_name(sessions, tmp_path):
    world = populate(sessions)
    with sessions.begin() as s:
        service.submit(s, world.alice, req(tmp_path, name="resnet_50%"), default_grace=30)
        replica = service.submit(s, world.alice, req(tmp_path, name="serve-pets"), default_grace=30)
        replica.kind = "serve"
        service.submit(s, world.bob, req(tmp_path, name="resnet-b"), default_grace=30)
    F = service.JobFilter
    with sessions() as s:
        def names(who, **kw):
            return sorted(j.name for j, _, _ in service.list_jobs(s, who, where=F(**kw)))

        assert names(world.alice, exclude_kinds=("serve",)) == ["resnet_50%"]
        assert names(world.alice, kinds=("serve",)) == ["serve-pets"]
        assert names(world.admin, name="resnet") == ["resnet-b", "resnet_50%"]
        assert names(world.admin, name="_50%") == ["resnet_50%"]  # LIKE wildcards are literal
        assert names(world.admin, name="t_b") == []  # "_" would match the "-" of resnet-b as a wildcard
        assert names(world.admin, tenant="b") == ["resnet-b"]
        assert names(world.alice, tenant="b") == []  # a user never sees another tenant's
        assert names(world.admin, user="alice", exclude_kinds=("serve",)) == ["resnet_50%"]
        with pytest.raises(InvalidRequest, match="unknown job kind"):
            service.list_jobs(s, world.alice, where=F(kinds=("trainer",)))


def test_default_job_names():
    from deeppod.jobs.service import default_name

    assert default_name(["python", "train.py", "--epochs", "3"]) == "train.py"
    assert default_name(["python", "-c", "print(1)"]) == "python"
    assert default_name(["/usr/bin/env", "bash", "scripts/run.sh"]) == "run.sh"



def test_a_resumed_jobs_run_time_counts_every_run(sessions, tmp_path):
    """DURATION of a job stopped after an hour and resumed 10 minutes ago: 70 minutes, not 10;
    and none of the time it waited in between."""
    from datetime import timedelta

    from deeppod.executor.fake import FakeExecutor
    from deeppod.jobs.controller import JobController
    from deeppod.jobs.service import run_seconds
    from deeppod.store.models import utcnow
    from tests.fixtures import submit_job

    w = populate(sessions)
    fake = FakeExecutor()
    jobs = JobController(sessions, fake, jobs_dir=tmp_path / "jobs", api_url="http://127.0.0.1:1",
                         server_env={"PATH": "/usr/bin"})
    jid = submit_job(sessions, w.alice, tmp_path, gpus_per_worker=1)
    jobs.tick()

    def shift(**ago):
        with sessions.begin() as s:
            s.get(Job, jid).started_at = utcnow() - timedelta(**ago)

    shift(hours=1)
    with sessions.begin() as s:
        service.stop(s, w.alice, jid)
    jobs.tick()
    fake.finish(jid, {0: 75})
    jobs.tick()
    with sessions() as s:
        job = s.get(Job, jid)
        assert job.state == "stopped" and run_seconds(job) == pytest.approx(3600, abs=30)
    with sessions.begin() as s:
        service.resume(s, w.alice, jid)
    with sessions() as s:
        assert run_seconds(s.get(Job, jid)) == pytest.approx(3600, abs=30)  # queued: the clock does not run
    jobs.tick()
    shift(minutes=10)
    with sessions() as s:
        job = s.get(Job, jid)
        assert job.state == "running" and run_seconds(job) == pytest.approx(4200, abs=30)


def test_a_gpu_memory_request_is_refused_where_no_gpu_has_it_and_reaches_the_scheduler(sessions, tmp_path):
    from deeppod.cluster.gpus import FakeProbe, GpuInfo
    from deeppod.cluster.inventory import local_node
    from deeppod.cluster.service import register_node
    from deeppod.jobs.snapshot import snapshot
    from deeppod.scheduler import Config

    world = populate(sessions)  # 4 logical slots: they do not say their memory, so any request fits
    with sessions.begin() as s:
        first = service.submit(s, world.alice, req(tmp_path, gpu_memory_mb=200_000), default_grace=30)
        assert first.gpu_memory_mb == 200_000
        l4 = [GpuInfo(i, f"GPU-{i}", "NVIDIA L4", 22_563, False) for i in range(4)]
        register_node(s, local_node(FakeProbe(l4), cpus=8, memory_mb=16384))
    for change, message in [(dict(gpu_memory_mb=40_000), "the largest GPUs have 22563 MiB"),
                            (dict(gpu_memory_mb=8000, gpus_per_worker=0), "for no GPU"),
                            (dict(gpu_memory_mb=0), "at least 1 MiB")]:
        with pytest.raises(InvalidRequest, match=message):
            with sessions.begin() as s:
                service.submit(s, world.alice, req(tmp_path, **change), default_grace=30)
    with sessions.begin() as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 1  # the refused wrote nothing
        job = service.submit(s, world.alice, req(tmp_path, workers=2, gpu_memory_mb=20_000), default_grace=30)
    with sessions() as s:
        snap = snapshot(s, folder=lambda i: None, in_place=False, config=Config(), now=0.0)
    assert [n.gpu_memory_mb for n in snap.nodes] == [22_563]
    assert {q.id: q.gpu_memory_mb for q in snap.queued} == {first.id: 200_000, job.id: 20_000}


def test_a_command_not_found_says_the_jobs_path_not_the_servers(sessions, tmp_path, monkeypatch):
    """Issue 70: the refusal echoed the server's own PATH, with the folders under its user's home."""
    from tests.fixtures import submit_job

    world = populate(sessions)
    monkeypatch.setenv("HOME", "/home/srv")
    monkeypatch.setenv("PATH", "/home/srv/.secret-tools/bin:/usr/bin:/bin")
    with pytest.raises(InvalidRequest, match="was not found on the job's PATH") as refused:
        submit_job(sessions, world.alice, tmp_path, command=["no-such-program-here"])
    assert "/usr/bin:/bin" in str(refused.value) and "/home/srv" not in str(refused.value)


def test_a_jobs_state_moves_only_along_the_table_and_an_illegal_move_is_refused_and_recorded(sessions, tmp_path):
    w = populate(sessions)
    with sessions.begin() as s:
        job = service.submit(s, w.alice, req(tmp_path), default_grace=30)
        assert service.move(s, job, JobState.RUNNING, "")
        assert service.move(s, job, JobState.PREEMPTED, "its GPUs went to another job")
        assert job.reason == "its GPUs went to another job"
        service.finish(s, job, JobState.SUCCEEDED, "all workers exited 0")
        assert not service.move(s, job, JobState.RUNNING, "started")  # an ended job never runs again
        service.finish(s, job, JobState.FAILED, "late news")  # nor ends twice
        assert (job.state, job.reason) == (JobState.SUCCEEDED, "all workers exited 0")
        events = [(e.kind, e.message) for e in s.scalars(select(JobEvent).where(JobEvent.job_id == job.id))]
    assert ("illegal-move", "a move from succeeded to running was refused (started)") in events
    assert ("illegal-move", "a move from succeeded to failed was refused (late news)") in events
    assert [k for k, _ in events].count("failed") == 0


def test_the_table_holds_the_lifecycle_the_contract_describes():
    assert set(MOVES) == set(JobState)
    for line in JobState.__doc__.split("::")[1].split("\n\n")[0].strip().splitlines():
        states = [part.split("(")[0].strip().split(" | ") for part in line.split("->")]
        for before, after in zip(states, states[1:]):
            for a in before:
                for b in after:
                    assert JobState(b) in MOVES[JobState(a)], (a, b)
    assert all(not MOVES[s] for s in FINAL_STATES - {JobState.STOPPED})  # an end is the end; a stop resumes
    assert MOVES[JobState.STOPPED] == {JobState.QUEUED}


def test_only_the_move_function_writes_a_jobs_state():
    """Every writer goes through jobs.service.move (the simulator's jobs are its own)."""
    import ast
    from pathlib import Path

    src = Path(service.__file__).parents[1]
    writers = []
    for path in src.rglob("*.py"):
        if path.name == "simulator.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for t in targets:
                for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    if isinstance(el, ast.Attribute) and el.attr == "state" and isinstance(el.value, ast.Name) \
                            and el.value.id in ("job", "j"):
                        writers.append(f"{path.relative_to(src)}:{el.lineno}")
    move_line = service.move.__code__.co_firstlineno
    assert all(w.startswith("jobs/service.py:") and int(w.split(":")[1]) - move_line < 15 for w in writers), writers
    assert len(writers) == 1, writers
