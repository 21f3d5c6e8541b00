"""Round trips through the models on SQLite and PostgreSQL."""

from datetime import timezone

from sqlalchemy import select

from deeppod.store.models import Job, JobEvent, Tenant, User


def test_job_round_trip_keeps_json_and_utc(sessions):
    with sessions.begin() as s:
        t = Tenant(name="t")
        s.add(t)
        s.flush()
        u = User(name="u", tenant_id=t.id)
        s.add(u)
        s.flush()
        job = Job(name="j", tenant_id=t.id, user_id=u.id, command=["python", "-c", "print(1)"], workdir="/tmp",
                  env={"A": "1"}, allocation={"workers": [{"rank": 0, "gpus": [1, 2]}]})
        s.add(job)
        s.flush()
        s.add(JobEvent(job_id=job.id, kind="queued", message="m"))
        job_id = job.id
    with sessions() as s:
        job = s.get(Job, job_id)
        assert job.command == ["python", "-c", "print(1)"]
        assert job.env == {"A": "1"}
        assert job.allocation["workers"][0]["gpus"] == [1, 2]
        assert job.submitted_at.tzinfo is not None
        assert job.submitted_at.utcoffset() == timezone.utc.utcoffset(None)
        assert job.state == "queued"
        events = s.scalars(select(JobEvent).where(JobEvent.job_id == job_id)).all()
        assert [e.kind for e in events] == ["queued"]
