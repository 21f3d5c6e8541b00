"""The audit log: mutating calls and refusals are recorded with who, what, when, from where."""

from datetime import timedelta

from deeppod.audit.log import worth_keeping
from deeppod.audit.service import apply_retention
from deeppod.store.models import AuditEvent, utcnow


def test_what_is_worth_keeping():
    assert worth_keeping("POST", "/v1/jobs", 201)
    assert worth_keeping("DELETE", "/v1/tokens/3", 204)
    assert not worth_keeping("GET", "/v1/jobs", 200)
    assert worth_keeping("GET", "/v1/jobs", 401)  # a failed sign-in
    assert worth_keeping("GET", "/v1/jobs/3", 403)
    assert not worth_keeping("POST", "/v1/deployments/pets/predict", 200)  # the data path
    assert worth_keeping("POST", "/v1/deployments/pets/predict", 401)
    assert not worth_keeping("POST", "/v1/jobs/3/metrics", 202)


def test_calls_and_failures_are_recorded_and_only_admins_read_them(api, tmp_path):
    ana = api.user("ana", "vision")
    A, ADMIN = api.as_(ana), api.as_(api.admin)
    assert api.http.post("/v1/tokens", json={"name": "ci"}, headers=A).status_code == 201
    assert api.http.get("/v1/jobs", headers={"Authorization": "Bearer dp_stolen"}).status_code == 401
    assert api.http.post("/v1/tenants", json={"name": "x"}, headers=A).status_code == 403
    api.http.get("/v1/jobs", headers=A)  # a read: not recorded
    r = api.http.get("/v1/audit", headers=A)
    assert r.status_code == 403
    events = api.http.get("/v1/audit", headers=ADMIN).json()
    seen = [(e["user"], e["method"], e["path"], e["status"]) for e in events]
    assert ("ana", "POST", "/v1/tokens", 201) in seen
    assert (None, "GET", "/v1/jobs", 401) in seen
    assert ("ana", "POST", "/v1/tenants", 403) in seen
    assert ("ana", "GET", "/v1/audit", 403) in seen
    assert ("ana", "GET", "/v1/jobs", 200) not in seen
    assert all(e["client"] for e in events)
    failed = api.http.get("/v1/audit", params={"failed": True, "user": "ana"}, headers=ADMIN).json()
    assert {e["status"] for e in failed} == {403}


def test_retention_drops_old_events(api):
    now = utcnow()
    with api.ctx.sessions.begin() as s:
        s.add(AuditEvent(at=now - timedelta(days=400), method="POST", path="/old", status=201))
        s.add(AuditEvent(at=now - timedelta(days=1), method="POST", path="/new", status=201))
    with api.ctx.sessions.begin() as s:
        assert apply_retention(s, 365, now) == 1
        assert apply_retention(s, 0, now) == 0
    with api.ctx.sessions() as s:
        assert [e.path for e in s.query(AuditEvent).all()] == ["/new"]


def test_a_batch_is_written_whole_on_either_database(sessions):
    from sqlalchemy import select

    from deeppod.audit.log import AuditLog, Entry

    log = AuditLog(sessions)
    for i in range(250):
        log.record(Entry("PUT", f"/s3/inbox/cats/{i}.png", 200, "127.0.0.1", "ana", "vision", "key"))
    log.record(Entry("GET", "/v1/jobs", 401))
    assert log.flush() == 251 and log.flush() == 0
    with sessions() as s:
        rows = s.scalars(select(AuditEvent).order_by(AuditEvent.id)).all()
    assert len(rows) == 251 and [r.path for r in rows[:2]] == ["/s3/inbox/cats/0.png", "/s3/inbox/cats/1.png"]
    assert (rows[0].user, rows[0].tenant, rows[0].token_kind, rows[0].client) == ("ana", "vision", "key", "127.0.0.1")
    assert (rows[-1].user, rows[-1].status, rows[-1].token_kind) == (None, 401, "none") and rows[-1].at is not None
