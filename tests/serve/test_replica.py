"""A serving replica answers only the control plane (serve/replica.py): without its secret a
caller gets a 401 on predict, signature and metrics and a bare health answer; with it, all."""

import io

import pytest
from PIL import Image
from starlette.testclient import TestClient

from deeppod.contract import REPLICA_SECRET_HEADER
from deeppod.serve.replica import Replica
from tests.serve.test_batcher import small_model  # noqa: F401 (fixture)


@pytest.fixture
def replica(small_model):  # noqa: F811
    r = Replica(small_model, max_batch=4, max_wait_ms=1, max_body_bytes=1 << 20, name="pets", version=2,
                replica_id="7", secret="s3cret")
    with TestClient(r.app()) as http:
        yield http
    r.batcher.close()


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 10, 10)).save(out, "PNG")
    return out.getvalue()


def test_a_caller_without_the_secret_gets_nothing_but_alive(replica):
    for method, path in (("POST", "/predict"), ("GET", "/signature"), ("GET", "/metrics")):
        for headers in ({}, {REPLICA_SECRET_HEADER: "guess"}):
            r = replica.request(method, path, content=png() if method == "POST" else None,
                                headers={"content-type": "image/png", **headers})
            assert r.status_code == 401 and "control plane" in r.json()["error"]["message"], (path, r.text)
    assert replica.get("/healthz").json() == {"ok": True}  # no model name, version or load


def test_the_control_plane_with_the_secret_gets_everything(replica):
    ok = {REPLICA_SECRET_HEADER: "s3cret"}
    r = replica.post("/predict", content=png(), headers={"content-type": "image/png", **ok})
    assert r.status_code == 200 and len(r.json()["predictions"]) == 1
    assert replica.get("/signature", headers=ok).json()["classes"] == ["a", "b", "c", "d"]
    assert replica.get("/metrics", headers=ok).status_code == 200
    assert replica.get("/healthz", headers=ok).json()["model"] == "pets"
