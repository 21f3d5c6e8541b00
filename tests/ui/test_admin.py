"""The console's admin page: tokens for everyone, users and tenants for those who manage
them, the plan as YAML (bad plans refused next to the field, nothing applied), cordon."""

import re

from tests.ui.conftest import Browser, field_errors


def _secret(html: str) -> str:
    return re.search(r'<code id="secret">([^<]+)</code>', html).group(1)


def test_a_member_makes_and_revokes_own_tokens_and_sees_no_users(api):
    ana = api.user("ana", "vision")
    b = Browser(api, ana)
    page = b.get("/admin").text
    assert 'id="tokens"' in page and 'id="users"' not in page and 'id="plan-form"' not in page
    r = b.post("/admin/tokens", {"token_name": "laptop", "scope": "read", "expires_days": "7"})
    secret = _secret(r.text)
    who = api.http.get("/v1/whoami", headers=api.as_(secret)).json()
    assert who["user"] == "ana" and who["scope"] == "read"
    token_id = [t for t in api.http.get("/v1/tokens", headers=api.as_(ana)).json() if t["name"] == "laptop"][0]["id"]
    assert "revoked" in b.post(f"/admin/tokens/{token_id}/revoke").text
    assert api.http.get("/v1/whoami", headers=api.as_(secret)).status_code == 401
    assert page.count('<option value="7" >in a week</option>') == 2  # tokens' and S3 keys' expiry choices
    r = b.post("/admin/tokens", {"token_name": "x", "scope": "everything", "expires_days": "30"})
    assert r.status_code == 422 and "scope" in field_errors(r.text)
    assert '<option value="30" selected>in 30 days</option>' in r.text  # what was chosen is kept
    r = b.post("/admin/tokens", {"token_name": "x", "scope": "all", "expires_days": "forever"})
    assert r.status_code == 422 and "expires_days" in field_errors(r.text)
    r = b.post("/admin/tokens", {"token_name": "x", "scope": "all", "token_user": "admin"})
    assert r.status_code in (403, 422)  # a member makes tokens only for themself
    assert b.post("/admin/users", {"user": "eve", "user_tenant": "vision"}).status_code == 403
    assert b.post("/admin/plan", {"plan": "tenants: []"}).status_code == 403


def test_s3_access_keys_are_made_shown_once_and_revoked_from_the_admin_page(api):
    ana, lee = api.user("ana", "vision"), api.user("lee", "vision", role="viewer")
    b = Browser(api, ana)
    r = b.post("/admin/access-keys", {"key_name": "laptop", "key_scope": "write", "key_expires_days": "30"})
    assert r.status_code == 200
    key_id = re.search(r"AWS_ACCESS_KEY_ID=(DPK\w+)", r.text).group(1)
    assert _secret(r.text) in r.text.split("AWS_SECRET_ACCESS_KEY=")[1]
    keys = api.http.get("/v1/access-keys", headers=api.as_(ana)).json()
    assert [(k["key_id"], k["name"], k["scope"]) for k in keys] == [(key_id, "laptop", "write")]
    assert keys[0]["expires_at"] is not None
    page = b.get("/admin").text
    assert f'data-key="{key_id}"' in page and _secret(r.text) not in page
    r = b.post("/admin/access-keys", {"key_name": "x", "key_scope": "admin"})
    assert r.status_code == 422 and "key_scope" in field_errors(r.text)
    r = b.post("/admin/access-keys", {"key_name": "x", "key_expires_days": "forever"})
    assert r.status_code == 422 and "key_expires_days" in field_errors(r.text)
    viewer = Browser(api, lee)  # a viewer makes read-only keys only, told so by the scope
    r = viewer.post("/admin/access-keys", {"key_name": "v", "key_scope": "write"})
    assert r.status_code == 403 and "read-only keys only" in field_errors(r.text)["key_scope"]
    assert viewer.post("/admin/access-keys", {"key_name": "v", "key_scope": "read"}).status_code == 200
    assert viewer.post(f"/admin/access-keys/{key_id}/revoke").status_code == 404  # not theirs
    assert f"{key_id} revoked" in b.post(f"/admin/access-keys/{key_id}/revoke").text
    assert api.http.get("/v1/access-keys", headers=api.as_(ana)).json()[0]["revoked_at"] is not None


def test_an_admin_sizes_a_cluster_from_the_admin_page_and_members_may_not(api):
    b = Browser(api, api.admin)
    assert 'href="/admin/size"' in b.get("/admin").text
    form = b.get("/admin/size").text
    assert 'value="1281167"' in form and 'id="size-result"' not in form  # an example to start from
    q = {"images": "1281167", "epochs": "90", "hours": "24", "images_per_gpu": "2900", "users": "20",
         "runs_per_user_day": "2", "wait_minutes": "30", "job_gpus": ""}
    r = b.get("/admin/size", params=q)
    assert r.status_code == 200 and 'id="size-result"' in r.text
    gpus = int(re.search(r'data-value="gpus">(\d+)<', r.text).group(1))
    assert gpus >= 20 and "(chosen)" in r.text and "simulator" in r.text  # 442 GPU-hours a day
    assert 'value="20"' in r.text  # the form keeps what was asked
    r = b.get("/admin/size", params={**q, "epochs": "-1"})
    assert r.status_code == 422 and "greater than or equal to 0.001" in field_errors(r.text)["epochs"]
    assert 'value="1281167"' in r.text and 'value="2900"' in r.text and 'value="-1"' in r.text  # nothing cleared
    r = b.get("/admin/size", params={**q, "inference_rps": "100"})
    assert r.status_code in (400, 422) and "--rps-per-gpu" in r.text
    ana = Browser(api, api.user("ana", "vision"))
    assert ana.get("/admin/size").status_code == 403
    assert 'href="/admin/size"' not in ana.get("/admin").text


def test_an_admin_adds_a_tenant_and_a_user_whose_token_works(api):
    b = Browser(api, api.admin)
    assert "tenant lab created" in b.post("/admin/tenants", {"tenant": "lab"}).text
    r = b.post("/admin/tenants", {"tenant": "lab"})
    assert r.status_code == 409 and "already exists" in field_errors(r.text)["tenant"]
    r = b.post("/admin/tenants", {"tenant": "Bad Name!"})
    assert r.status_code == 422 and "not valid" in field_errors(r.text)["tenant"]
    r = b.post("/admin/users", {"user": "lee", "user_tenant": "lab", "role": "viewer"})
    assert api.http.get("/v1/whoami", headers=api.as_(_secret(r.text))).json()["role"] == "viewer"
    r = b.post("/admin/users", {"user": "kim", "user_tenant": "nowhere", "role": "member"})
    assert r.status_code in (404, 422) and "user_tenant" in field_errors(r.text)
    r = b.post("/admin/users", {"user": "kim", "user_tenant": "lab", "role": "king"})
    assert r.status_code == 422 and "role" in field_errors(r.text)
    assert "lee is now member" in b.post("/admin/users/lee/role", {"role": "member"}).text


def test_the_plan_is_edited_as_yaml_and_bad_plans_are_refused_whole(api):
    b = Browser(api, api.admin)
    r = b.post("/admin/plan", {"plan": "tenants:\n  - name: default\n    guaranteed: 2\n"})
    assert "plan applied" in r.text and "bursting needs" not in r.text
    r = b.post("/admin/plan", {"plan": "tenants:\n  - name: default\n    guaranteed: 2\nburst:\n  - {name: cloud, "
                                       "gpus: 1, max_nodes: 1, cost_per_hour: 2, tenants: [default]}\n"})
    assert "plan applied" in r.text and "bursting needs --executor ray" in r.text  # one machine adds no node
    assert api.http.get("/v1/plan", headers=api.as_(api.admin)).json()["plan"]["tenants"][0]["guaranteed"] == 2
    for bad, says in (("tenants: [", "not valid YAML"), ("- a\n- b", "write the plan as"),
                      ("tenants:\n  - name: default\n    guaranteed: -3\n", "guaranteed"),
                      ("tenants:\n  - guaranteed: 1\n", "name")):
        r = b.post("/admin/plan", {"plan": bad})
        assert r.status_code == 422 and says in field_errors(r.text).get("plan", ""), (bad, field_errors(r.text))
        assert bad.split("\n")[0] in r.text  # what was typed is kept
    assert api.http.get("/v1/plan", headers=api.as_(api.admin)).json()["plan"]["tenants"][0]["guaranteed"] == 2


def test_an_admin_cordons_and_uncordons_from_the_cluster_page(api):
    b = Browser(api, api.admin)
    node = api.http.get("/v1/nodes", headers=api.as_(api.admin)).json()[0]["name"]
    assert 'class="row cordon"' in b.get("/cluster").text
    assert b.post(f"/cluster/nodes/{node}/health", {"gpu": "2", "healthy": "no"}).status_code == 303
    assert 'title="GPU 2: cordoned' in b.get("/cluster").text
    b.post(f"/cluster/nodes/{node}/health", {"gpu": "2", "healthy": "yes"})
    assert 'title="GPU 2: free' in b.get("/cluster").text
    assert b.post(f"/cluster/nodes/{node}/health", {"gpu": "9", "healthy": "no"}).status_code == 422
    assert b.post(f"/cluster/nodes/{node}/health", {"gpu": "x", "healthy": "no"}).status_code == 422
    assert b.post("/cluster/nodes/nosuch/health", {"healthy": "no"}).status_code == 404
    member = Browser(api, api.user("ana", "vision"))
    assert 'class="row cordon"' not in member.get("/cluster").text
    assert member.post(f"/cluster/nodes/{node}/health", {"healthy": "no"}).status_code == 403


def test_a_form_that_waits_for_the_database_holds_up_no_other_request(fresh_server):
    """Another writer holds the SQLite database: a console form posted meanwhile waits for it
    in the thread pool, not on the event loop, so the server keeps answering; then it lands."""
    import sqlite3
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    server = fresh_server.start()
    c = httpx.Client(base_url=server.url, timeout=60)
    assert c.post("/login", data={"token": server.admin_token, "next": "/jobs"}).status_code == 303
    csrf = re.search(r'name="csrf" value="([^"]+)"', c.get("/jobs/new").text).group(1)
    other = sqlite3.connect(server.home / "deeppod.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with ThreadPoolExecutor(1) as pool:
            posted = pool.submit(httpx.post, f"{server.url}/admin/tenants", cookies=c.cookies, timeout=60,
                                 data={"tenant": "waited", "csrf": csrf})
            for _ in range(10):
                assert httpx.get(f"{server.url}/healthz", timeout=2).status_code == 200
            assert not posted.done()  # it is waiting for the database all this time
            other.rollback()
            assert posted.result(timeout=60).status_code == 200
    finally:
        other.close()
    assert "waited" in c.get("/admin").text


def test_the_cluster_page_shows_burst_nodes_their_types_and_what_they_cost(api):
    from deeppod.cluster.gpus import LogicalProbe
    from deeppod.cluster.inventory import NodeInfo
    from deeppod.cluster.service import register_node
    from deeppod.store.models import BurstCharge

    api.user("ana", "vision")
    cy = api.user("cy", "nlp")
    plan = {"tenants": [{"name": "vision", "burst_budget": 40}, {"name": "nlp"}],
            "burst": [{"name": "cloud", "gpus": 1, "max_nodes": 3, "cost_per_hour": 2.5, "tenants": ["vision"]}]}
    assert api.http.put("/v1/plan", json=plan, headers=api.as_(api.admin)).status_code == 200
    with api.ctx.sessions.begin() as s:
        register_node(s, NodeInfo("cloud-7", "10.0.0.7", 4, 8192, tuple(LogicalProbe(1).probe()), burst="cloud"))
        s.add(BurstCharge(node="cloud-7", node_type="cloud", tenant="vision", seconds=5400.0, cost=3.75))
    page = Browser(api, api.admin).get("/cluster").text
    assert "burst: cloud" in page and 'id="burst-types"' in page
    assert "<td>cloud</td><td>1</td><td>1 of 3</td>" in page
    assert "<td>vision</td><td>cloud</td><td>1</td><td>1.500</td><td>3.75</td>" in page
    assert "vision spent 3.75 of 40" in page
    assert "bursting needs --executor ray" in page  # one machine: no autoscaler adds nodes
    nlp = Browser(api, cy).get("/cluster").text
    assert 'id="burst-types"' in nlp and "3.75" not in nlp  # another tenant's cost is not shown


def test_a_down_node_says_why_on_the_cluster_page(api):
    """As its cluster said it (Slurm's state and Reason, kept by cluster/service.sync_nodes)."""
    from deeppod.store.models import Node

    with api.ctx.sessions.begin() as s:
        s.add(Node(name="gpu-02", address="10.0.0.2", cpus=8, memory_mb=16384, up=False,
                   gpus=[{"index": 0, "logical": True}], down_reason="drained in Slurm: fan <failure>"))
    page = Browser(api, api.user("ana", "vision")).get("/cluster").text
    assert "down</span> <span class=\"muted\">drained in Slurm: fan &lt;failure&gt;</span>" in page
    assert 'title="GPU 0: down: drained in Slurm: fan &lt;failure&gt;"' in page
