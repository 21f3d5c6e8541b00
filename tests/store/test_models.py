"""Round trips through the models on SQLite and PostgreSQL."""

from datetime import UTC

from sqlalchemy import select

from deeppod.contract import HOLDING_STATES, JobState
from deeppod.executor.slurm import waiting_reason
from deeppod.store.models import Job, JobEvent, Tenant, User

LONG_PHASE = waiting_reason("QOSMaxGRESPerUser") + " (requeued by Slurm)"


def owner(s) -> tuple[Tenant, User]:
    t = Tenant(name="t")
    s.add(t)
    s.flush()
    u = User(name="u", tenant_id=t.id)
    s.add(u)
    s.flush()
    return t, u


def test_job_round_trip_keeps_json_and_utc(sessions):
    with sessions.begin() as s:
        t, u = owner(s)
        job = Job(name="j", tenant_id=t.id, user_id=u.id, command=["python", "-c", "print(1)"], workdir="/tmp",
                  env={"A": "1"}, allocation={"workers": [{"rank": 0, "gpus": [1, 2]}]}, phase=LONG_PHASE)
        s.add(job)
        s.flush()
        s.add(JobEvent(job_id=job.id, kind="queued", message="m"))
        job_id = job.id
    with sessions() as s:
        job = s.get(Job, job_id)
        assert job.command == ["python", "-c", "print(1)"]
        assert job.env == {"A": "1"}
        assert job.allocation["workers"][0]["gpus"] == [1, 2]
        assert job.phase == LONG_PHASE  # Slurm's reasons in DeepPod's words: past the 64 characters it once had
        assert job.submitted_at.tzinfo is not None
        assert job.submitted_at.utcoffset() == UTC.utcoffset(None)
        assert job.state is JobState.QUEUED  # loaded as the enum, stored as its plain value
        events = s.scalars(select(JobEvent).where(JobEvent.job_id == job_id)).all()
        assert [e.kind for e in events] == ["queued"]


def test_job_states_filter_as_plain_values(sessions):
    with sessions.begin() as s:
        t, u = owner(s)
        for state in JobState:
            s.add(Job(name=str(state), tenant_id=t.id, user_id=u.id, state=state, command=["x"], workdir="/"))
    with sessions() as s:
        holding = s.scalars(select(Job.name).where(Job.state.in_(HOLDING_STATES))).all()
        assert sorted(holding) == ["preempted", "resizing", "running"]
        assert s.scalars(select(Job.state).where(Job.state == "stopped")).one() is JobState.STOPPED


def test_job_env_is_sealed_at_rest_and_legacy_rows_get_sealed(sessions):
    from sqlalchemy import text

    from deeppod.jobs.service import seal_legacy_env

    with sessions.begin() as s:
        t, u = owner(s)
        job = Job(name="j", tenant_id=t.id, user_id=u.id, command=["true"], workdir="/tmp",
                  env={"AWS_SECRET_ACCESS_KEY": "hunter2"})
        s.add(job)
        s.flush()
        job_id = job.id
        # a row written before sealing existed
        s.add(Job(name="old", tenant_id=t.id, user_id=u.id, command=["true"], workdir="/tmp", env={}))
        s.flush()
        s.execute(text("UPDATE jobs SET env = '{\"TOKEN\": \"s3cr3t\"}' WHERE name = 'old'"))
    def raw() -> dict[str, str]:
        with sessions() as s:
            return {r[0]: str(r[1]) for r in s.execute(text("SELECT name, env FROM jobs"))}

    assert "hunter2" not in raw()["j"] and "sealed" in raw()["j"]
    assert "s3cr3t" in raw()["old"]
    with sessions.begin() as s:
        assert seal_legacy_env(s) == 1
    assert "s3cr3t" not in raw()["old"]
    with sessions() as s:
        assert s.get(Job, job_id).env == {"AWS_SECRET_ACCESS_KEY": "hunter2"}
        assert s.scalars(select(Job).where(Job.name == "old")).one().env == {"TOKEN": "s3cr3t"}
