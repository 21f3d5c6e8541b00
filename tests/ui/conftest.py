from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient


class Browser:
    """A console client with its own cookies (a browser), signed in with a token."""

    def __init__(self, api, token: str | None):
        self.api = api
        self.http = TestClient(api.http.app, follow_redirects=False)
        self.csrf = ""
        if token is not None:
            r = self.http.post("/login", data={"token": token, "next": "/jobs"})
            assert r.status_code == 303, r.text
            self.csrf = re.search(r'name="csrf" value="([^"]+)"', self.http.get("/jobs/new").text).group(1)

    def get(self, path: str, **kw):
        return self.http.get(path, **kw)

    def post(self, path: str, data: dict | None = None, *, csrf: bool = True, **kw):
        body = {**(data or {}), **({"csrf": self.csrf} if csrf else {})}
        return self.http.post(path, data=body, **kw)


@pytest.fixture
def browser_as(api):
    return lambda token: Browser(api, token)


def field_errors(html: str) -> dict[str, str]:
    return dict(re.findall(r'<p class="field-error" id="e-([a-z_]+)" role="alert">([^<]*)</p>', html))
