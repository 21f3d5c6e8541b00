"""No console page answers 5xx to bad input: every console route, with odd path values,
odd query values and odd form bodies, answers below 500 (and says what to fix)."""

import itertools
import re

import pytest
from fastapi.routing import APIRoute

from tests.ui.conftest import Browser

ODD = ["0", "-1", "99999999999999999999", "x" * 300, "a b", "..", "%2e%2e", "%00", "nosuch@9", "1@latest", "ü"]
QUERIES = ["", "?page=-3", "?page=x", "?sort=--id", "?max_points=-5", "?rank=abc", "?hours=-1", "?label=%00",
           "?q=classes%3Eabc", "?a=1&b=zz", "?state=%00"]
FORMS = [{}, {"version": "x", "replicas": "-1", "data": "@@", "plan": "{", "gpu": "zz", "healthy": "maybe",
              "command": "'", "workers": "1:0", "env": "=", "role": "god", "scope": "x", "expires_days": "9"}]


def _console_routes():
    from deeppod.ui import auth
    from deeppod.ui.routes import admin, cluster, datasets, deployments, jobs, models

    for module in (auth, admin, cluster, datasets, jobs, models, deployments):
        for r in module.router.routes:
            if isinstance(r, APIRoute):
                for method in r.methods - {"HEAD"}:
                    yield method, r.path


@pytest.fixture
def b(api, tmp_path):
    r = api.http.post("/v1/jobs", json={"command": ["python", "x.py"], "workdir": str(tmp_path)},
                      headers=api.as_(api.admin))
    assert r.status_code == 201
    return Browser(api, api.admin)


def test_every_console_route_answers_bad_input_without_a_5xx(api, b):
    routes = sorted(set(_console_routes()))
    assert len(routes) > 25, routes
    bad = []
    for method, path in routes:
        names = re.findall(r"{(\w+)(?::\w+)?}", path)
        for values in itertools.islice(itertools.product(ODD, repeat=len(names)), 30):
            url = path
            for name, value in zip(names, values):
                url = re.sub(r"{" + name + r"(?::\w+)?}", value, url)
            for q in QUERIES[:4] if names else QUERIES:
                if method == "GET":
                    r = b.get(url + q)
                    cases = [r]
                else:
                    cases = [b.post(url + q, form) for form in FORMS]
                for r in cases:
                    if r.status_code >= 500:
                        bad.append((method, url + q, r.status_code, r.text[:200]))
    assert not bad, bad[:10]
