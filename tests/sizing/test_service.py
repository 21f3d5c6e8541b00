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


def test_many_users_are_not_simulated_here(api):
    """Issue 70: 100,000 users (about 19,600 simulated tenants) kept a server thread busy for over
    25 minutes; past MAX_TENANTS users the answer is the arithmetic, at once."""
    from deeppod.sizing import service

    r = api.http.post("/v1/sizing", json={**IMAGENET, "users": 100_000, "runs_per_user_day": 0.01},
                      headers=api.as_(api.admin))
    assert r.status_code == 200 and r.json()["waits"] == []
    assert f"of {service.MAX_TENANTS:,} users" in r.json()["why"][-1]


def test_simulations_stop_at_the_time_budget_and_when_the_client_is_gone(api):
    from deeppod.sizing import Workload, service

    class Clock:  # each look at it is a minute later: the budget is spent after the first size
        t = 0.0

        def __call__(self):
            self.t += 60.0
            return self.t

    work = Workload(**{**IMAGENET, "users": 10, "runs_per_user_day": 1, "wait_minutes": 0})  # no size meets it
    cut = service.recommend(_admin(api), work, clock=Clock())
    assert len(cut.waits) == 1 and any("stopped after 1 size," in line for line in cut.why), cut.why
    gone = service.recommend(_admin(api), work, gone=lambda: True)
    assert len(gone.waits) == 1


def _admin(api):
    from deeppod.auth.service import authenticate

    with api.ctx.sessions() as s:
        return authenticate(s, api.admin)


def test_a_request_whose_client_hangs_up_stops_simulating(api, monkeypatch):
    """The route asks the connection between sizes: a client gone ends the work (a TestClient
    request cannot hang up, so the receive is made to say so)."""
    from deeppod.api import hangup

    seen = []
    real = hangup.in_thread_until_gone

    async def hung_up(request, fn, *args):
        async def disconnected():
            return True
        request.is_disconnected = disconnected
        out = await real(request, fn, *args)
        seen.append(out)
        return out

    monkeypatch.setattr("deeppod.api.routers.sizing.in_thread_until_gone", hung_up)
    r = api.http.post("/v1/sizing", json={**IMAGENET, "users": 10, "runs_per_user_day": 1, "wait_minutes": 0},
                      headers=api.as_(api.admin))
    assert r.status_code == 200 and seen
    assert any("simulations were stopped after" in line for line in r.json()["why"]), r.json()["why"]
