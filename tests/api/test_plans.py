"""The plan endpoint: the surplus order and idle-first reclaim travel through the API."""


def test_the_surplus_order_is_applied_shown_and_checked(api):
    ADMIN = api.as_(api.admin)
    api.user("ana", "vision")
    plan = {"tenants": [{"name": "vision", "guaranteed": 1}], "surplus": "share", "reclaim_idle_first": True}
    r = api.http.put("/v1/plan", json=plan, headers=ADMIN)
    assert r.status_code == 200, r.text
    shown = api.http.get("/v1/plan", headers=ADMIN).json()["plan"]
    assert shown["surplus"] == "share" and shown["reclaim_idle_first"] is True
    # left out: the default (least attained service first), which the document does not repeat
    r = api.http.put("/v1/plan", json={"tenants": [{"name": "vision", "guaranteed": 1}]}, headers=ADMIN)
    assert r.status_code == 200 and "surplus" not in r.json()["plan"]
    r = api.http.put("/v1/plan", json={**plan, "surplus": "fair"}, headers=ADMIN)
    assert r.status_code == 422 and "'surplus' must be 'service'" in r.json()["error"]["message"]
    assert "surplus" not in api.http.get("/v1/plan", headers=ADMIN).json()["plan"]  # the old plan stays


def test_burst_types_on_a_server_without_an_autoscaler_are_kept_with_a_warning(api):
    """One machine (no autoscaler) never adds a burst node: applying burst types says so, and
    the plan still holds them (the same plan is valid on a Ray cluster)."""
    ADMIN = api.as_(api.admin)
    api.user("ana", "vision")
    burst = [{"name": "cloud", "gpus": 1, "max_nodes": 2, "cost_per_hour": 3.0, "tenants": ["vision"]}]
    r = api.http.put("/v1/plan", json={"tenants": [{"name": "vision"}], "burst": burst}, headers=ADMIN)
    assert r.status_code == 200, r.text
    assert [w for w in r.json()["warnings"] if "bursting needs --executor ray" in w], r.json()
    assert api.http.get("/v1/plan", headers=ADMIN).json()["plan"]["burst"][0]["name"] == "cloud"
    r = api.http.put("/v1/plan", json={"tenants": [{"name": "vision"}]}, headers=ADMIN)
    assert r.status_code == 200 and r.json()["warnings"] == []
