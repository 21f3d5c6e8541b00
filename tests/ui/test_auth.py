"""Console sign-in: an HttpOnly SameSite cookie instead of the token, CSRF on every change,
the token's scope and revocation, sign-out, and no open redirect."""

from datetime import timedelta

from sqlalchemy import select

from deeppod.store.models import ConsoleSession, Token, utcnow
from tests.ui.conftest import Browser


def test_pages_need_a_sign_in_and_come_back_after_it(api):
    b = Browser(api, None)
    r = b.get("/jobs?state=running")
    assert r.status_code == 303 and r.headers["location"] == "/login?next=/jobs%3Fstate%3Drunning"
    assert b.get("/jobs", headers={"HX-Request": "true"}).headers["HX-Redirect"].startswith("/login")
    r = b.http.post("/login", data={"token": api.admin, "next": "/jobs?state=running"})
    assert r.status_code == 303 and r.headers["location"] == "/jobs?state=running"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and api.admin not in cookie
    assert b.get("/jobs").status_code == 200


def test_a_bad_token_is_refused_on_the_page_and_audited(api):
    b = Browser(api, None)
    r = b.http.post("/login", data={"token": "dp_nope"})
    assert r.status_code == 401 and "unknown or revoked" in r.text and 'aria-invalid="true"' in r.text
    r = b.http.post("/login", data={"token": "  "})
    assert r.status_code == 401 and "paste a token" in r.text
    api.ctx.audit.flush()
    assert any(e["status"] == 401 and e["path"] == "/login"
               for e in api.http.get("/v1/audit", headers=api.as_(api.admin)).json())


def test_only_local_paths_are_followed_after_sign_in(api):
    for target in ("https://evil.example/x", "//evil.example", "jobs", ""):
        r = Browser(api, None).http.post("/login", data={"token": api.admin, "next": target})
        assert r.headers["location"] == "/jobs", target


def test_a_form_from_elsewhere_is_refused(api, tmp_path):
    b = Browser(api, api.admin)
    r = b.post("/jobs/new", {"command": "python x.py", "workdir": str(tmp_path)}, csrf=False)
    assert r.status_code == 403 and "stale or did not come from the console" in r.text
    r = b.post("/jobs/new", {"command": "python x.py", "workdir": str(tmp_path), "csrf": "forged"}, csrf=False)
    assert r.status_code == 403
    assert api.http.get("/v1/jobs", headers=api.as_(api.admin)).json() == []  # nothing was submitted
    r = Browser(api, None).http.post("/login", data={"token": api.admin}, headers={"Origin": "https://evil.example"})
    assert r.status_code == 403  # login CSRF


def test_a_read_only_token_reads_but_changes_nothing(api, tmp_path):
    ana = api.user("ana", "vision")
    job = api.http.post("/v1/jobs", json={"command": ["python", "x.py"], "workdir": str(tmp_path)},
                        headers=api.as_(ana)).json()["id"]
    ro = api.http.post("/v1/tokens", json={"name": "ro", "scope": "read"}, headers=api.as_(ana)).json()["token"]
    b = Browser(api, ro)
    page = b.get(f"/jobs/{job}")
    assert page.status_code == 200 and 'id="stop"' not in page.text
    r = b.post(f"/jobs/{job}/cancel")
    assert r.status_code == 403 and "read-only" in r.text
    assert api.http.get(f"/v1/jobs/{job}", headers=api.as_(ana)).json()["state"] == "queued"
    assert b.post("/jobs/new", {"command": "python x.py", "workdir": str(tmp_path)}).status_code == 403


def test_a_job_token_cannot_sign_in(api, tmp_path):
    with api.ctx.sessions.begin() as s:
        from deeppod.auth.tokens import hash_secret
        from deeppod.store.models import User

        admin = s.scalar(select(User).where(User.name == "admin"))
        s.add(Token(user_id=admin.id, token_hash=hash_secret("dp_jobtoken"), job_id=1))
    r = Browser(api, None).http.post("/login", data={"token": "dp_jobtoken"})
    assert r.status_code == 403 and "own token cannot sign in" in r.text


def test_revoking_the_token_or_signing_out_ends_the_session(api):
    ana = api.user("ana", "vision")
    b = Browser(api, ana)
    cookie = b.http.cookies.get("deeppod_console")
    assert b.get("/jobs").status_code == 200
    tokens = api.http.get("/v1/tokens", headers=api.as_(ana)).json()
    api.http.delete(f"/v1/tokens/{tokens[0]['id']}", headers=api.as_(ana))
    assert b.get("/jobs").headers["location"].startswith("/login")

    admin = Browser(api, api.admin)
    cookie = admin.http.cookies.get("deeppod_console")
    assert admin.post("/logout").status_code == 303
    thief = Browser(api, None)
    thief.http.cookies.set("deeppod_console", cookie)
    assert thief.get("/jobs").status_code == 303  # the old cookie is worth nothing


def test_a_session_ends_when_it_expires(api):
    b = Browser(api, api.admin)
    with api.ctx.sessions.begin() as s:
        for row in s.scalars(select(ConsoleSession)):
            row.expires_at = utcnow() - timedelta(seconds=1)
    assert b.get("/cluster").status_code == 303
