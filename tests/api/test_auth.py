"""Who may do what: 401 without a token, 403 across tenants, admins see all."""

import sys

import pytest


@pytest.fixture
def people(api, tmp_path):
    alice = api.user("alice", "a")
    bob = api.user("bob", "b")
    jobs = {}
    for who, tok in (("alice", alice), ("bob", bob)):
        r = api.http.post("/v1/jobs", json={"command": [sys.executable, "-c", "1"], "workdir": str(tmp_path),
                                            "name": f"{who}-job"}, headers=api.as_(tok))
        assert r.status_code == 201, r.text
        jobs[who] = r.json()["id"]
    return alice, bob, jobs


ENDPOINTS = [("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", "/v1/jobs/1"), ("POST", "/v1/jobs/1/cancel"),
             ("GET", "/v1/jobs/1/logs"), ("GET", "/v1/jobs/1/events"), ("GET", "/v1/tenants"),
             ("POST", "/v1/tenants"), ("GET", "/v1/users"), ("POST", "/v1/users"), ("GET", "/v1/tokens"),
             ("POST", "/v1/tokens"), ("DELETE", "/v1/tokens/1"), ("GET", "/v1/nodes"), ("GET", "/v1/whoami")]


@pytest.mark.parametrize("method,path", ENDPOINTS)
@pytest.mark.parametrize("auth", [None, "Bearer dp_wrong", "Basic abc", "Bearer "])
def test_every_call_needs_a_valid_token(api, method, path, auth):
    headers = {"Authorization": auth} if auth else {}
    r = api.http.request(method, path, headers=headers, json={} if method == "POST" else None)
    assert r.status_code == 401, (method, path, r.text)
    assert r.json()["error"]["code"] == "unauthenticated"


def test_tenant_matrix(api, people):
    alice, bob, jobs = people
    A, B, ADMIN = api.as_(alice), api.as_(bob), api.as_(api.admin)
    # each user sees only their tenant's jobs; the admin sees all
    assert [j["name"] for j in api.http.get("/v1/jobs", headers=A).json()] == ["alice-job"]
    assert [j["name"] for j in api.http.get("/v1/jobs", headers=B).json()] == ["bob-job"]
    assert {j["name"] for j in api.http.get("/v1/jobs", headers=ADMIN).json()} == {"alice-job", "bob-job"}
    # another tenant's job answers on every verb exactly as a job that does not exist: ids and
    # activity cannot be enumerated
    other, missing = jobs["bob"], 10_000
    for method, path in (("GET", "/v1/jobs/{}"), ("POST", "/v1/jobs/{}/cancel"), ("GET", "/v1/jobs/{}/logs"),
                         ("GET", "/v1/jobs/{}/events"), ("GET", "/v1/jobs/{}/metrics")):
        r = api.http.request(method, path.format(other), headers=A)
        nothing = api.http.request(method, path.format(missing), headers=A)
        assert r.status_code == nothing.status_code == 404, (method, path, r.text)
        assert r.json()["error"] == {**nothing.json()["error"],
                                     "message": nothing.json()["error"]["message"].replace(str(missing), str(other))}
    assert api.http.get(f"/v1/jobs/{other}", headers=ADMIN).status_code == 200
    assert api.http.get(f"/v1/jobs/{jobs['alice']}", headers=A).status_code == 200
    # bob's job is untouched by alice's attempt to cancel it
    assert api.http.get(f"/v1/jobs/{other}", headers=B).json()["cancel_requested"] is False


def test_only_admins_manage_tenants_and_users(api, people):
    alice, _, _ = people
    A = api.as_(alice)
    assert api.http.post("/v1/tenants", json={"name": "c"}, headers=A).status_code == 403
    assert api.http.post("/v1/users", json={"name": "eve", "tenant": "a"}, headers=A).status_code == 403
    assert api.http.post("/v1/tokens", json={"user": "bob"}, headers=A).status_code == 403
    assert [t["name"] for t in api.http.get("/v1/tenants", headers=A).json()] == ["a"]
    r = api.http.post("/v1/users", json={"name": "carol", "tenant": "a", "admin": True}, headers=api.as_(api.admin))
    assert r.status_code == 201
    carol = api.as_(r.json()["token"])
    assert api.http.get("/v1/whoami", headers=carol).json() == {"user": "carol", "tenant": "a", "is_admin": True,
                                                                  "role": "admin", "scope": "all", "job_id": None,
                                                                  "isolation": "single-user", "work_roots": None}
    assert len(api.http.get("/v1/jobs", headers=carol).json()) == 2


def test_tokens_create_list_revoke(api, people):
    alice, _, _ = people
    A = api.as_(alice)
    r = api.http.post("/v1/tokens", json={"name": "laptop"}, headers=A)
    assert r.status_code == 201
    new = r.json()
    assert new["user"] == "alice" and new["token"].startswith("dp_")
    assert "laptop" in [t["name"] for t in api.http.get("/v1/tokens", headers=A).json()]
    assert all("token" not in t for t in api.http.get("/v1/tokens", headers=A).json())
    assert api.http.delete(f"/v1/tokens/{new['id']}", headers=A).status_code == 204
    assert api.http.get("/v1/whoami", headers=api.as_(new["token"])).status_code == 401


def test_the_api_docs_page_needs_no_internet(api):
    page = api.http.get("/docs")
    assert page.status_code == 200 and "swagger-ui" in page.text
    assert "cdn" not in page.text.lower() and "https://" not in page.text.split("<body>")[0]
    for asset in ("/static/swagger/swagger-ui-bundle.js", "/static/swagger/swagger-ui.css"):
        assert asset in page.text
        r = api.http.get(asset)
        assert r.status_code == 200 and len(r.content) > 100_000
    assert api.http.get("/openapi.json").json()["openapi"].startswith("3.")


def test_a_server_that_does_not_isolate_holds_one_tenant(tmp_path):
    from fastapi.testclient import TestClient

    from deeppod.cluster.gpus import LogicalProbe
    from deeppod.executor.fake import FakeExecutor
    from deeppod.server import bootstrap_admin, build, http_app
    from deeppod.settings import Settings

    # what "auto", the default, is where the server is not root
    ctx = build(Settings(home=tmp_path / "home", isolation="one-tenant"), executor=FakeExecutor(),
                probe=LogicalProbe(1))
    admin = {"Authorization": f"Bearer {bootstrap_admin(ctx)}"}
    with TestClient(http_app(ctx)) as http:
        r = http.post("/v1/tenants", json={"name": "second"}, headers=admin)
        assert r.status_code == 409 and "--isolation sandbox" in r.json()["error"]["message"]
        assert [t["name"] for t in http.get("/v1/tenants", headers=admin).json()] == ["default"]
        assert http.post("/v1/users", json={"name": "ana", "tenant": "default"}, headers=admin).status_code == 201
    ctx.engine.dispose()


def test_the_default_isolation_sandboxes_wherever_it_can():
    from deeppod.server import resolve_isolation

    assert resolve_isolation("auto", supported=lambda: None) == "sandbox"
    assert resolve_isolation("auto", supported=lambda: "not root") == "one-tenant"
    assert resolve_isolation("single-user", supported=lambda: None) == "single-user"  # asked for: kept
    with pytest.raises(Exception, match="use auto, sandbox"):
        resolve_isolation("jail")
