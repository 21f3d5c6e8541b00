"""Admission (api/admission.py): past as many requests as the database pool serves, a request
waits its turn briefly, then gets a fast 503 busy with Retry-After; /healthz always passes.
The SDK sends a shed request again (it was never run)."""

import asyncio

import httpx
import pytest

from deeppod import Client
from deeppod.api.admission import Admission
from deeppod.sdk import client as sdk


def held_app(started: list, release: asyncio.Event):
    async def app(scope, receive, send):
        started.append(scope["path"])
        if scope["path"] != "/healthz":
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
    return app


def test_past_its_slots_a_request_waits_then_gets_a_fast_503():
    async def scenario():
        started, release = [], asyncio.Event()
        gate = Admission(held_app(started, release), slots=2, wait_s=0.3)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gate), base_url="http://t") as c:
            busy = [asyncio.create_task(c.get(f"/v1/jobs/{i}")) for i in range(2)]
            while len(started) < 2:
                await asyncio.sleep(0.01)
            loop = asyncio.get_running_loop()
            began = loop.time()
            shed = await c.post("/v1/jobs", json={})  # no slot within 0.3 s
            waited = loop.time() - began
            health = await c.get("/healthz")  # passes by, however full
            queued = asyncio.create_task(c.get("/v1/jobs/9"))
            await asyncio.sleep(0.05)
            release.set()  # the held ones end: the queued one gets a slot
            done = [await t for t in busy] + [await queued]
            return shed, waited, health, done, gate.shed, started

    shed, waited, health, done, count, started = asyncio.run(scenario())
    assert shed.status_code == 503 and shed.headers["retry-after"] == "1"
    assert shed.json()["error"]["code"] == "busy" and "retry" in shed.json()["error"]["message"]
    assert 0.25 <= waited < 2.0
    assert health.status_code == 200 and [r.status_code for r in done] == [200, 200, 200]
    assert count == 1 and "/v1/jobs" not in started  # the shed request never reached the app


def test_the_sdk_sends_a_shed_request_again(monkeypatch):
    monkeypatch.setattr(sdk.time, "sleep", lambda s: None)
    answers = [503, 503, 201]
    seen = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.method)
        status = answers.pop(0)
        if status == 503:
            return httpx.Response(503, headers={"retry-after": "1"},
                                  json={"error": {"code": "busy", "message": "the server is busy"}})
        return httpx.Response(status, json={"id": 1})

    c = Client("http://deeppod.invalid:1", "tok")
    c._http = httpx.Client(base_url=c.url, transport=httpx.MockTransport(answer))
    assert c._request("POST", "/v1/jobs", json={"command": ["true"]}) == {"id": 1}
    assert seen == ["POST"] * 3
    # another 503 (not 'busy': a replica down, say) is an error at once
    c._http = httpx.Client(base_url=c.url, transport=httpx.MockTransport(
        lambda r: httpx.Response(503, json={"error": {"code": "unavailable", "message": "no replica"}})))
    with pytest.raises(Exception, match="no replica"):
        c._request("GET", "/v1/deployments/x")
    c.close()


def test_healthz_answers_while_every_thread_of_the_pool_is_taken(api):
    """/healthz runs on the event loop: a burst whose database work fills the thread pool (or
    waits on a lock in it) does not queue the health probe behind it."""
    import anyio
    import anyio.to_thread

    async def scenario():
        limiter = anyio.to_thread.current_default_thread_limiter()
        limiter.total_tokens = 1
        taken, done = asyncio.Event(), asyncio.Event()

        async def busy():  # another request's work holds the pool's only thread
            async with limiter:
                taken.set()
                await done.wait()

        holder = asyncio.create_task(busy())
        await taken.wait()
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api.http.app), base_url="http://t") as c:
                with anyio.fail_after(10):
                    return await c.get("/healthz")
        finally:
            done.set()
            await holder

    health = asyncio.run(scenario())
    assert health.status_code == 200 and health.json()["ok"] is True


def test_the_slots_are_what_the_pool_serves_and_at_most_three_a_cpu(tmp_path):
    from types import SimpleNamespace

    from deeppod.api.app import BACKGROUND_CONNECTIONS, admission_slots
    from deeppod.store.db import make_engine, pool_capacity

    engine = make_engine(f"sqlite:///{tmp_path / 'd.db'}")
    pool = pool_capacity(engine) - BACKGROUND_CONNECTIONS
    ctx = SimpleNamespace(engine=engine, settings=SimpleNamespace(api_concurrency=0))
    assert admission_slots(ctx, cpus=2) == 6  # this machine's kind: 3 a core, not the pool's 24
    assert admission_slots(ctx, cpus=1) == 4  # never fewer than 4
    assert admission_slots(ctx, cpus=64) == pool  # many cores: the pool is the bound
    assert admission_slots(ctx) >= 4  # the server's own CPUs
    ctx.settings.api_concurrency = 40
    assert admission_slots(ctx, cpus=2) == 40  # DEEPPOD_API_CONCURRENCY decides
    engine.dispose()


def test_metrics_say_how_many_requests_get_in_and_how_many_were_shed(api):
    from prometheus_client.parser import text_string_to_metric_families

    from deeppod.api.app import admission_slots

    shed = []
    gate = Admission(held_app([], asyncio.Event()), slots=1, wait_s=0.05, on_shed=lambda: shed.append(1))

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gate), base_url="http://t") as c:
            held = asyncio.create_task(c.get("/v1/jobs/1"))
            await asyncio.sleep(0.05)
            busy = await c.get("/v1/jobs/2")
            held.cancel()
            return busy

    assert asyncio.run(scenario()).status_code == 503 and shed == [1]
    r = api.http.get("/metrics", headers=api.as_(api.admin))
    fams = {f.name: f for f in text_string_to_metric_families(r.text)}
    assert fams["deeppod_api_concurrency_limit"].samples[0].value == admission_slots(api.ctx)
    assert "deeppod_api_shed" in fams
