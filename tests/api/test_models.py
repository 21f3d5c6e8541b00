"""The models API: owner means the tenant, as for datasets."""

from tests.models.test_service import artifact


def test_a_models_owner_is_its_tenant_and_created_by_its_user(api, tmp_path):
    alice = api.user("alice", "vision")
    r = api.http.post("/v1/models/pets/versions", json={"path": str(artifact(tmp_path / "art"))},
                      headers=api.as_(alice))
    assert r.status_code == 201, r.text
    shown = api.http.get("/v1/models/pets", headers=api.as_(alice)).json()
    assert (shown["owner"], shown["created_by"]) == ("vision", "alice")
    [listed] = api.http.get("/v1/models", headers=api.as_(alice)).json()
    assert (listed["owner"], listed["created_by"]) == ("vision", "alice")
