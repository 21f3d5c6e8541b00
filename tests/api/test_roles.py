"""Roles (admin, tenant-admin, member, viewer), token scopes and expiry, job tokens."""

import sys

from deeppod.store.models import Token, utcnow


def _job(api, token, tmp_path, name="j"):
    r = api.http.post("/v1/jobs", json={"command": [sys.executable, "-c", "1"], "workdir": str(tmp_path),
                                        "name": name}, headers=api.as_(token))
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_members_manage_their_own_jobs_tenant_admins_all_of_their_tenant(api, tmp_path):
    ana, ben = api.user("ana", "vision"), api.user("ben", "vision")
    boss = api.user("boss", "vision", role="tenant-admin")
    j1, j2 = _job(api, ana, tmp_path), _job(api, ana, tmp_path)
    # ben sees ana's job but may not change it
    assert api.http.get(f"/v1/jobs/{j1}", headers=api.as_(ben)).status_code == 200
    r = api.http.post(f"/v1/jobs/{j1}/cancel", headers=api.as_(ben))
    assert r.status_code == 403 and "another user's" in r.json()["error"]["message"]
    assert api.http.get(f"/v1/jobs/{j1}", headers=api.as_(ana)).json()["state"] == "queued"
    assert api.http.post(f"/v1/jobs/{j1}/cancel", headers=api.as_(ana)).status_code == 200
    assert api.http.post(f"/v1/jobs/{j2}/stop", headers=api.as_(boss)).status_code == 200


def test_viewers_and_read_tokens_only_read(api, tmp_path):
    vic = api.user("vic", "vision", role="viewer")
    ana = api.user("ana", "vision")
    job = _job(api, ana, tmp_path)
    V = api.as_(vic)
    assert api.http.get("/v1/jobs", headers=V).status_code == 200
    for method, path in (("POST", "/v1/jobs"), ("POST", f"/v1/jobs/{job}/cancel"), ("POST", "/v1/tokens")):
        r = api.http.request(method, path, headers=V, json={"command": ["true"], "workdir": str(tmp_path)})
        assert r.status_code == 403 and "viewers only read" in r.json()["error"]["message"], (method, path)
    read = api.http.post("/v1/tokens", json={"scope": "read"}, headers=api.as_(ana)).json()
    assert read["scope"] == "read"
    R = api.as_(read["token"])
    assert api.http.get(f"/v1/jobs/{job}", headers=R).status_code == 200
    r = api.http.post(f"/v1/jobs/{job}/cancel", headers=R)
    assert r.status_code == 403 and "read-only" in r.json()["error"]["message"]
    assert api.http.get(f"/v1/jobs/{job}", headers=api.as_(ana)).json()["cancel_requested"] is False
    # what they may make: their own read-only S3 access keys (to read data with an S3 client)
    for who in (V, R):
        r = api.http.post("/v1/access-keys", json={"scope": "write"}, headers=who)
        assert r.status_code == 403 and "read-only keys only" in r.json()["error"]["message"]
        key = api.http.post("/v1/access-keys", json={"scope": "read"}, headers=who).json()
        assert key["scope"] == "read"
        assert api.http.delete(f"/v1/access-keys/{key['key_id']}", headers=who).status_code == 204


def test_a_predict_token_only_predicts(api):
    ana = api.user("ana", "vision")
    p = api.http.post("/v1/tokens", json={"scope": "predict", "name": "app"}, headers=api.as_(ana)).json()
    P = api.as_(p["token"])
    assert api.http.get("/v1/whoami", headers=P).json()["scope"] == "predict"
    for method, path in (("GET", "/v1/jobs"), ("GET", "/v1/models"), ("POST", "/v1/tokens")):
        r = api.http.request(method, path, headers=P, json={})
        assert r.status_code == 403 and "only call predict" in r.json()["error"]["message"], (method, path)
    # it passes the scope check on predict (then finds no such deployment)
    r = api.http.post("/v1/deployments/none/predict", headers=P, content=b"x")
    assert r.status_code == 404, r.text


def test_tokens_expire(api):
    ana = api.user("ana", "vision")
    t = api.http.post("/v1/tokens", json={"expires_in": 3600}, headers=api.as_(ana)).json()
    assert t["expires_at"] is not None
    assert api.http.get("/v1/whoami", headers=api.as_(t["token"])).status_code == 200
    assert api.http.post("/v1/tokens", json={"expires_in": 5}, headers=api.as_(ana)).status_code == 422
    with api.ctx.sessions.begin() as s:
        s.get(Token, t["id"]).expires_at = utcnow()
    r = api.http.get("/v1/whoami", headers=api.as_(t["token"]))
    assert r.status_code == 401 and "expired" in r.json()["error"]["message"]


def test_tenant_admins_administer_their_subtree_only(api):
    api.user("x", "lab-a")
    api.user("y", "other")
    boss = api.user("boss", "lab", role="tenant-admin")
    B = api.as_(boss)
    ADMIN = api.as_(api.admin)
    plan = {"tenants": [{"name": "lab", "guaranteed": 2, "children": [{"name": "lab-a", "guaranteed": 1}]},
                        {"name": "other", "guaranteed": 1}]}
    api.http.post("/v1/tenants", json={"name": "lab"}, headers=ADMIN)
    assert api.http.put("/v1/plan", json=plan, headers=ADMIN).status_code == 200
    # users: in its tenant and below, never an admin, never elsewhere
    assert api.http.post("/v1/users", json={"name": "new", "tenant": "lab-a"}, headers=B).status_code == 201
    assert api.http.post("/v1/users", json={"name": "n2", "tenant": "other"}, headers=B).status_code == 403
    assert api.http.post("/v1/users", json={"name": "n3", "tenant": "lab", "role": "admin"},
                         headers=B).status_code == 403
    assert {u["name"] for u in api.http.get("/v1/users", headers=B).json()} == {"boss", "x", "new"}
    # tokens for its users, not for others
    t = api.http.post("/v1/tokens", json={"user": "x"}, headers=B)
    assert t.status_code == 201
    assert api.http.post("/v1/tokens", json={"user": "y"}, headers=B).status_code == 403
    assert api.http.delete(f"/v1/tokens/{t.json()['id']}", headers=B).status_code == 204
    # the plan below its node, nothing else
    below = {"tenants": [{"name": "lab", "guaranteed": 2, "children": [{"name": "lab-a", "guaranteed": 2}]},
                         {"name": "other", "guaranteed": 1}]}
    assert api.http.put("/v1/plan", json=below, headers=B).status_code == 200
    own = {"tenants": [{"name": "lab", "guaranteed": 3, "children": [{"name": "lab-a", "guaranteed": 2}]},
                       {"name": "other", "guaranteed": 1}]}
    r = api.http.put("/v1/plan", json=own, headers=B)
    assert r.status_code == 403 and "only the plan below" in r.json()["error"]["message"]
    # cordon nothing, make no tenants
    assert api.http.patch("/v1/nodes/local", json={"healthy": False}, headers=B).status_code == 403
    assert api.http.post("/v1/tenants", json={"name": "z"}, headers=B).status_code == 403


def test_a_job_token_reaches_only_its_own_job(api, tmp_path):
    ana = api.user("ana", "vision")
    mine, other = _job(api, ana, tmp_path), _job(api, ana, tmp_path)
    api.ctx.jobs.tick()
    spec = api.ctx.executor.launched[mine]
    J = {"Authorization": f"Bearer {spec.workers[0].env['DEEPPOD_TOKEN']}"}
    assert api.http.get(f"/v1/jobs/{mine}", headers=J).status_code == 200
    assert api.http.post(f"/v1/jobs/{mine}/metrics", json={"points": [{"step": 1, "metrics": {"loss": 0.5}}]},
                         headers=J).status_code == 202
    for method, path in (("GET", f"/v1/jobs/{other}"), ("POST", f"/v1/jobs/{other}/cancel"), ("GET", "/v1/jobs"),
                         ("POST", "/v1/jobs"), ("POST", "/v1/tokens"), ("GET", "/v1/datasets"),
                         ("POST", f"/v1/jobs/{mine}/cancel")):
        r = api.http.request(method, path, headers=J, json={})
        assert r.status_code == 403 and "job's token" in r.json()["error"]["message"], (method, path, r.text)
    r = api.http.post("/v1/models/m/versions", json={"job_id": other}, headers=J)
    assert r.status_code == 403 and "own model" in r.json()["error"]["message"]
    # revoked when the job ends, within the second
    api.ctx.executor.finish(mine, {0: 0})
    api.ctx.jobs.tick()
    assert api.http.get(f"/v1/jobs/{mine}", headers=api.as_(ana)).json()["state"] == "succeeded"
    assert api.http.get(f"/v1/jobs/{mine}", headers=J).status_code == 401


def test_revocation_reaches_predict_at_once_on_the_server_that_revoked(api):
    """The predict path reads tokens from a cache; revoking through this server empties it, so
    the next call is refused whatever the cache's clock says (stopped here: no entry ages and no
    refresh runs). Another server's revocation arrives within the cache's ttl (tests/auth/test_cache.py)."""
    api.ctx.principals.clock = lambda: 0.0
    ana = api.user("ana", "vision")
    t = api.http.post("/v1/tokens", json={"scope": "predict"}, headers=api.as_(ana)).json()
    P = api.as_(t["token"])
    assert api.http.post("/v1/deployments/none/predict", headers=P, content=b"x").status_code == 404  # cached now
    assert api.ctx.principals.fresh(t["token"]) is not None
    assert api.http.delete(f"/v1/tokens/{t['id']}", headers=api.as_(ana)).status_code == 204
    assert api.http.post("/v1/deployments/none/predict", headers=P, content=b"x").status_code == 401


def test_roles_change_and_hold_from_the_next_call(api, tmp_path):
    ana = api.user("ana", "vision")
    boss = api.user("boss", "vision", role="tenant-admin")
    api.user("out", "other")
    A, B = api.as_(ana), api.as_(boss)
    assert api.http.post("/v1/jobs", json={"command": ["true"], "workdir": str(tmp_path)}, headers=A).status_code != 403
    r = api.http.patch("/v1/users/ana", json={"role": "viewer"}, headers=B)
    assert r.status_code == 200 and r.json()["role"] == "viewer"
    assert api.http.post("/v1/tokens", json={}, headers=A).status_code == 403  # a viewer now
    assert api.http.patch("/v1/users/ana", json={"role": "admin"}, headers=B).status_code == 403
    assert api.http.patch("/v1/users/out", json={"role": "viewer"}, headers=B).status_code == 403
    assert api.http.patch("/v1/users/boss", json={"role": "admin"}, headers=B).status_code == 403  # not your own
    assert api.http.patch("/v1/users/ana", json={"role": "owner"}, headers=B).status_code == 422
    assert api.http.patch("/v1/users/nobody", json={"role": "member"}, headers=api.as_(api.admin)).status_code == 404
    r = api.http.patch("/v1/users/ana", json={"role": "admin"}, headers=api.as_(api.admin))
    assert r.status_code == 200 and r.json()["is_admin"] is True
    assert api.http.get("/v1/whoami", headers=A).json()["role"] == "admin"
