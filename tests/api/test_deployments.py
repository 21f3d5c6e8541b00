"""Replica announcements: only the replica itself, only at its node's address (no SSRF)."""

from tests.models.test_service import artifact


def test_only_the_replica_announces_and_only_its_nodes_address(api, tmp_path):
    alice = api.user("alice", "vision")
    h = api.as_(alice)
    assert api.http.post("/v1/models/pets/versions", json={"path": str(artifact(tmp_path / "art"))},
                         headers=h).status_code == 201
    r = api.http.post("/v1/deployments", json={"model": "pets@1", "replicas": 2}, headers=h)
    assert r.status_code == 201, r.text
    # where to try it: the console's page (styled, signed in once), not a page that asks for a token
    assert r.json()["page_url"].endswith("/deployments/pets#try-it")
    api.ctx.deployments.tick()  # submits the replicas
    api.ctx.jobs.tick()  # starts them (fake executor)
    launched = api.ctx.executor.launched
    assert len(launched) == 2
    (one, spec_one), (two, spec_two) = sorted(launched.items())
    own = {"Authorization": f"Bearer {spec_one.workers[0].env['DEEPPOD_TOKEN']}"}
    other = {"Authorization": f"Bearer {spec_two.workers[0].env['DEEPPOD_TOKEN']}"}

    refused = api.http.put(f"/v1/replicas/{one}", json={"url": "http://127.0.0.1:9000"}, headers=h)
    assert refused.status_code == 403 and "its job's token" in refused.json()["error"]["message"]
    assert api.http.put(f"/v1/replicas/{one}", json={"url": "http://127.0.0.1:9000"},
                        headers=other).status_code == 403  # another replica's token
    ssrf = api.http.put(f"/v1/replicas/{one}", json={"url": "http://169.254.169.254:80"}, headers=own)
    assert ssrf.status_code == 403 and "node's address" in ssrf.json()["error"]["message"]
    ok = api.http.put(f"/v1/replicas/{one}", json={"url": "http://127.0.0.1:9000"}, headers=own)
    assert ok.status_code == 200, ok.text
