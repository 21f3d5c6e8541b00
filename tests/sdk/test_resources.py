"""``client.NOUN``: calling it lists, its verbs act on that noun and send what the flat names
send (sdk/resources.py); the flat names stay."""

import json

import httpx
import pytest

from deeppod import Client


@pytest.fixture
def sent():
    c = Client("http://deeppod.invalid:1", "tok")
    calls = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append((request.method, request.url.path, json.loads(request.content) if request.content else None))
        return httpx.Response(200, json=[] if request.method == "GET" else {"ok": True})

    c._http = httpx.Client(base_url=c.url, transport=httpx.MockTransport(answer))
    yield c, calls
    c.close()


def test_one_verb_acts_on_each_noun(sent):
    c, calls = sent
    assert c.jobs() == [] and c.experiments() == [] and c.deployments() == []
    c.jobs.stop(7)
    c.experiments.stop("lr-search")
    c.deployments.rollback("digits")
    c.datasets.stage("digits@2")
    assert [(m, p) for m, p, _ in calls] == [
        ("GET", "/v1/jobs"), ("GET", "/v1/experiments"), ("GET", "/v1/deployments"),
        ("POST", "/v1/jobs/7/stop"), ("POST", "/v1/experiments/lr-search/stop"),
        ("POST", "/v1/deployments/digits/rollback"), ("POST", "/v1/datasets/digits@2/stage")]


def test_the_flat_names_send_the_same(sent):
    c, calls = sent
    c.stop(7)
    c.stop_experiment("lr-search")
    c.jobs.stop(7)
    c.experiments.stop("lr-search")
    assert calls[:2] == calls[2:]


def test_each_verb_keeps_the_flat_methods_signature_and_doc():
    c = Client("http://deeppod.invalid:1", "tok")
    assert c.jobs.wait.__doc__ == Client.wait.__doc__ and c.jobs.wait.__wrapped__ is Client.wait
    assert {"get", "submit", "stop", "resume", "cancel", "logs", "wait"} <= set(dir(c.jobs))
    assert {"create", "stop", "resume", "get"} <= set(dir(c.experiments))
    c.close()
