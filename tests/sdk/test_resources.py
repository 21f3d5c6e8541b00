"""``client.NOUN``: calling it lists, its verbs act on that noun (sdk/resources.py); the flat
names of before are aliases that send the same."""

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


def test_each_resource_is_a_class_with_its_methods_written_out():
    """Type checkers and help() see each verb with its own signature; a flat name is an alias."""
    import inspect

    from deeppod.sdk.resources import FLAT, RESOURCES, Jobs

    c = Client("http://deeppod.invalid:1", "tok")
    assert type(c.jobs) is Jobs and "wait" in Jobs.__dict__ and "job_id" in inspect.signature(Jobs.wait).parameters
    assert Client.__annotations__["jobs"] in (Jobs, "Jobs")
    assert {"get", "submit", "stop", "resume", "cancel", "logs", "wait"} <= set(Jobs.__dict__)
    assert {"create", "stop", "resume", "get"} <= set(vars(type(c.experiments)))
    for flat, (noun, verb) in FLAT.items():  # every alias names a method that is there
        assert verb in vars(RESOURCES[noun]) and f"client.{noun}.{verb}" in getattr(Client, flat).__doc__
    c.close()
