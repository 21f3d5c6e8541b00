"""Sizing through the API: for administrators and tenant admins, bounded so a request cannot
hold the server (past the bounds: the arithmetic alone, saying why)."""

IMAGENET = {"images": 1_281_167, "epochs": 90, "hours": 24, "images_per_gpu": 2900}


def test_an_admin_sizes_a_workload_and_a_member_is_told_to_use_the_cli(api):
    r = api.http.post("/v1/sizing", json={**IMAGENET, "users": 20, "runs_per_user_day": 2}, headers=api.as_(api.admin))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["training_gpus"] >= 20 and body["waits"] and any("simulator" in line for line in body["why"])
    assert [w["gpus"] for w in body["waits"]] == sorted(w["gpus"] for w in body["waits"])
    r = api.http.post("/v1/sizing", json=IMAGENET, headers=api.as_(api.user("ana", "vision")))
    assert r.status_code == 403 and "deeppod size" in r.json()["error"]["message"]
    boss = api.user("boss", "vision", role="tenant-admin")
    assert api.http.post("/v1/sizing", json=IMAGENET, headers=api.as_(boss)).status_code == 200
    r = api.http.post("/v1/sizing", json={**IMAGENET, "epochs": 0}, headers=api.as_(api.admin))
    assert r.status_code == 422
    r = api.http.post("/v1/sizing", json={**IMAGENET, "gpu": 1}, headers=api.as_(api.admin))
    assert r.status_code == 422  # an unknown field is an error, not ignored


def test_a_workload_too_big_to_simulate_here_gets_the_arithmetic_and_why(api):
    r = api.http.post("/v1/sizing", json={**IMAGENET, "users": 5000, "runs_per_user_day": 10},
                      headers=api.as_(api.admin))
    assert r.status_code == 200
    body = r.json()
    assert body["waits"] == [] and body["training_gpus"] > 0
    assert "not simulated here" in body["why"][-1] and "deeppod size" in body["why"][-1]
