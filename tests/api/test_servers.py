"""GET /v1/servers: the servers sharing the database, and which one leads."""


def test_servers_lists_the_leader(api):
    r = api.http.get("/v1/servers", headers=api.as_(api.admin))
    assert r.status_code == 200, r.text
    assert r.json() == []  # built for tests: it leads alone, without joining the list
    leader = api.ctx.leader
    leader.epoch = None  # as a server that shares its database: it joins and claims the lease
    leader.join()
    assert leader.heartbeat()
    rows = api.http.get("/v1/servers", headers=api.as_(api.admin)).json()
    assert [(s["url"], s["leader"], s["live"], s["epoch"]) for s in rows] == [(api.ctx.settings.public_url, True,
                                                                               True, 1)]
    assert api.http.get("/v1/servers").status_code == 401
    health = api.http.get("/healthz").json()
    assert health["leader"] is True and health["epoch"] == 1
