"""Generated from the OpenAPI schema, so a new endpoint is covered by itself: every operation,
called by every role of tenant A and with a job token of A, against tenant B's resources,
leaks nothing of B's and changes nothing of B's; every answer is documented in the schema."""

import sys

import pytest

from deeppod.sdk.code import pack
from tests.models.test_service import artifact

MARK = "zz9secret"  # in B's job command, model description and token name: must never reach A


def _body(schema: dict, spec: dict) -> object:
    """A small valid-looking value for ``schema`` (required fields only)."""
    if "$ref" in schema:
        return _body(spec["components"]["schemas"][schema["$ref"].split("/")[-1]], spec)
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return _body(next((s for s in schema[key] if s.get("type") != "null"), schema[key][0]), spec)
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type")
    if kind == "object":
        return {k: _body(v, spec) for k, v in schema.get("properties", {}).items() if k in schema.get("required", [])}
    return {"string": "b-thing", "integer": 1, "number": 1.0, "boolean": False, "array": []}.get(kind, {})


@pytest.fixture
def world(api, tmp_path):
    """Tenant B with a job, a model, a deployment and a token; tenant A with every role."""
    b = api.user("bea", "b")
    B = api.as_(b)
    job = api.http.post("/v1/jobs", json={"command": [sys.executable, "-c", f"print('{MARK}')"], "name": "b-job",
                                          "workdir": str(tmp_path)}, headers=B)
    assert job.status_code == 201
    assert api.http.post("/v1/models/b-model/versions", json={"path": str(artifact(tmp_path / "art")),
                                                              "description": MARK}, headers=B).status_code == 201
    assert api.http.post("/v1/deployments", json={"model": "b-model@1", "name": "b-dep"}, headers=B).status_code == 201
    tok = api.http.post("/v1/tokens", json={"name": MARK}, headers=B).json()
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "b.py").write_text(f"print('{MARK}')")
    code = pack(tmp_path / "code")
    assert api.http.put(f"/v1/code/{code.digest}", content=code.data, headers=B).status_code == 200
    key = api.http.post("/v1/deployments/b-dep/keys", json={"name": "k"}, headers=B)
    roles = {role: api.user(f"a-{role}", "a", role=role) for role in ("tenant-admin", "member", "viewer")}
    mine = api.http.post("/v1/jobs", json={"command": [sys.executable, "-c", "1"], "workdir": str(tmp_path)},
                         headers=api.as_(roles["member"])).json()["id"]
    api.ctx.jobs.tick()
    roles["job"] = api.ctx.executor.launched[mine].workers[0].env["DEEPPOD_TOKEN"]
    params = {"job_id": job.json()["id"], "name": "b-model", "ref": "b-model@1", "token_id": tok["id"],
              "key_id": key.json().get("id", 1), "alias": "champion", "number": 0,
              "digest": code.digest, "key": _env_of(api, B)}
    return B, roles, params


def _env_of(api, headers) -> str:
    """A built environment of tenant B's (as a node's cache holds it): its key."""
    import json as _json

    from sqlalchemy import select

    from deeppod.envs.build import ready_file
    from deeppod.store.models import Tenant

    name = api.http.get("/v1/whoami", headers=headers).json()["tenant"]
    with api.ctx.sessions() as s:
        tenant_id = s.scalar(select(Tenant.id).where(Tenant.name == name))
    env = api.ctx.settings.envs_root / str(tenant_id) / "b0b0b0b0b0b0b0b0"
    env.mkdir(parents=True)
    ready_file(env).write_text(_json.dumps({"key": env.name, "requirements": [MARK], "built_at": 1.0}))
    return env.name


def _operations(api):
    spec = api.http.get("/openapi.json").json()
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            yield spec, path, method.upper(), op


def test_every_operation_with_every_role_of_a_foreign_tenant_leaks_nothing(api, world):
    B, roles, params = world
    seen = 0
    for spec, path, method, op in _operations(api):
        if not path.startswith("/v1/"):
            continue
        names = {"deployments": "b-dep", "datasets": "b-data"}.get(path.split("/")[2], "b-model")
        url = path.format(**{**params, "name": names})
        body = None
        if "requestBody" in op:
            content = op["requestBody"]["content"]
            if "application/json" in content:
                body = _body(content["application/json"]["schema"], spec)
        for role, token in roles.items():
            r = api.http.request(method, url, headers=api.as_(token), json=body)
            seen += 1
            assert MARK not in r.text, (role, method, url, r.text[:300])
            assert r.status_code < 500, (role, method, url, r.text[:300])
            assert str(r.status_code) in op["responses"], (role, method, url, r.status_code, r.text[:200])
    assert seen > 40 * len(roles)
    # B's things are as they were
    job = api.http.get(f"/v1/jobs/{params['job_id']}", headers=B).json()
    assert job["cancel_requested"] is False and job["state"] in ("queued", "running")
    assert api.http.get("/v1/models/b-model", headers=B).status_code == 200
    assert api.http.get("/v1/deployments/b-dep", headers=B).status_code == 200
    assert MARK in api.http.get("/v1/tokens", headers=B).text  # still there, unrevoked


def test_wrong_methods_get_405_with_allow(api):
    r = api.http.delete("/v1/whoami", headers=api.as_(api.admin))
    assert r.status_code == 405 and r.headers["allow"] == "GET"
    assert r.json()["error"]["code"] == "method_not_allowed" and "takes GET" in r.json()["error"]["message"]
    for _, path, _, op in _operations(api):
        assert {"405"} <= set(op["responses"]), path
