"""Console model and deployment pages (fake executor): versions with metrics and lineage,
two versions side by side, promote (refused without a win, forced), deploy with errors next
to the field, a deployment's page, rolling update and rollback, the traffic totals."""

import json
import re

import pytest

from tests.ui.conftest import Browser, field_errors

SIG = {"classes": ["cat", "dog"], "model": "small-cnn", "dataset": "pets@2", "hyperparameters": {"lr": 0.1},
       "metrics": {"val_accuracy": 0.9},
       "input": {"kind": "image", "shape": [3, 16, 16], "mean": [0.5] * 3, "std": [0.2] * 3, "crop": "center"}}


@pytest.fixture
def pets(api, tmp_path):
    """Model pets, v1 (lr 0.1, 0.90, loss 0.3) and v2 (lr 0.05, 0.95, loss 0.2), registered from artifact folders."""
    for n, (lr, acc, loss) in enumerate(((0.1, 0.90, 0.3), (0.05, 0.95, 0.2)), 1):
        folder = tmp_path / f"art{n}"
        folder.mkdir()
        (folder / "model.pt2").write_bytes(b"program")
        (folder / "weights.pt").write_bytes(b"weights")
        (folder / "signature.json").write_text(json.dumps({**SIG, "hyperparameters": {"lr": lr, "dataset": "pets@2"},
                                                           "metrics": {"val_accuracy": acc, "val_loss": loss}}))
        r = api.http.post("/v1/models/pets/versions", json={"path": str(folder)}, headers=api.as_(api.admin))
        assert r.status_code == 201, r.text
    return "pets"


def test_versions_with_metrics_lineage_and_side_by_side(api, pets):
    b = Browser(api, api.admin)
    assert 'data-model="pets"' in b.get("/models").text
    page = b.get("/models/pets").text
    assert page.count("<tr data-version=") == 2 and "0.95" in page and "lr=0.05" in page and "pets@2" in page
    side = b.get("/models/pets/compare?a=1&b=2").text
    assert re.search(r'data-metric="val_accuracy"><td>val_accuracy</td><td >0.9</td><td class="better">0.95', side)
    assert re.search(r'data-param="lr"><td>lr</td><td class="differs">0.1</td><td class="differs">0.05', side)
    # each metric is better in its own direction: the lower loss wins, not the higher
    assert re.search(r'data-metric="val_loss"><td>val_loss</td><td >0.3</td><td class="better">0.2', side)
    assert side.count("<td>dataset</td>") == 1  # issue 71: also listed among the hyperparameters
    assert b.get("/models/pets/compare?a=1&b=7").status_code == 404
    assert b.get("/models/pets/compare?a=1").status_code == 422


def test_promote_needs_a_win_unless_forced(api, pets):
    b = Browser(api, api.admin)
    r = b.post("/models/pets/promote", {"version": "1"})
    assert r.status_code == 200 and "v1 is the champion: there was no champion" in r.text
    r = b.post("/models/pets/promote", {"version": "2"})
    assert r.status_code == 409 and "no comparison of v2 with champion v1" in r.text
    r = b.post("/models/pets/promote", {"version": "2", "force": "on"})
    assert r.status_code == 200 and "forced" in r.text
    model = api.http.get("/v1/models/pets", headers=api.as_(api.admin)).json()
    assert model["aliases"]["champion"] == 2


def test_a_comparison_runs_as_a_job_on_the_data_named(api, pets):
    b = Browser(api, api.admin)
    r = b.post("/models/pets/compare", {"a": "1", "b": "2", "data": ""})
    assert r.status_code == 422 and "name the dataset version" in r.text
    r = b.post("/models/pets/compare", {"a": "1", "b": "2", "data": "nosuch@1"})
    assert r.status_code == 404 and "no such dataset" in r.text


def test_deploy_from_the_model_page_then_update_and_roll_back(api, pets):
    b = Browser(api, api.admin)
    r = b.post("/models/pets/deploy", {"version": "1", "deployment": "Bad Name", "replicas": "1"})
    assert r.status_code == 422 and "not valid" in field_errors(r.text).get("deployment", "")
    r = b.post("/models/pets/deploy", {"version": "1", "deployment": "pets", "replicas": "lots"})
    assert r.status_code == 422 and "whole number" in field_errors(r.text)["replicas"]
    assert api.http.get("/v1/deployments", headers=api.as_(api.admin)).json() == []
    r = b.post("/models/pets/deploy", {"version": "1", "deployment": "pets", "replicas": "1"})
    assert r.status_code == 303 and r.headers["location"] == "/deployments/pets"
    page = b.get("/deployments/pets").text
    assert 'id="dep-version">1<' in page and "DeepPod.traffic" in page and 'id="rollback"' not in page
    assert 'data-deployment="pets"' in b.get("/deployments").text
    part = b.post("/deployments/pets/update", {"version": "2", "replicas": "1"}, headers={"HX-Request": "true"}).text
    assert 'id="dep-version">2<' in part and "rolling out" in part and 'id="rollback"' in part
    part = b.post("/deployments/pets/rollback", headers={"HX-Request": "true"}).text
    assert 'id="dep-version">1<' in part and "rolling back" in part
    traffic = b.get("/deployments/pets/traffic.json").json()
    assert traffic["requests"] == 0 and traffic["at"] > 0 and isinstance(traffic["history"], list)
    r = b.post("/deployments/pets/update", {"version": "1", "replicas": "0"}, headers={"HX-Request": "true"})
    assert r.status_code == 422 and r.text.startswith('<p class="error"')


def test_predict_from_the_console_needs_a_serving_replica_and_the_csrf_secret(api, pets):
    b = Browser(api, api.admin)
    b.post("/models/pets/deploy", {"version": "1", "deployment": "pets", "replicas": "1"})
    r = b.http.post("/deployments/pets/predict", content=b"\x89PNG", headers={"content-type": "image/png",
                                                                             "Accept": "application/json"})
    assert r.status_code == 403  # no CSRF secret
    r = b.http.post("/deployments/pets/predict", content=b"\x89PNG", headers={
        "content-type": "image/png", "Accept": "application/json", "X-CSRF-Token": b.csrf})
    assert r.status_code == 404 and "is serving" in r.json()["error"]["message"]  # the fake executor serves nothing


def test_another_tenant_sees_no_model_or_deployment(api, pets):
    Browser(api, api.admin).post("/models/pets/deploy", {"version": "1", "deployment": "pets", "replicas": "1"})
    b = Browser(api, api.user("bob", "audio"))
    assert "pets" not in b.get("/models").text and "pets" not in b.get("/deployments").text
    for path in ("/models/pets", "/deployments/pets", "/deployments/pets/traffic.json", "/models/pets/compare?a=1&b=2"):
        assert b.get(path).status_code in (403, 404), path
    assert b.post("/models/pets/promote", {"version": "2", "force": "on"}).status_code in (403, 404)
    assert b.post("/deployments/pets/rollback").status_code in (403, 404)


def test_another_tenants_model_and_deployment_answer_as_missing_ones_in_the_api(api, pets):
    Browser(api, api.admin).post("/models/pets/deploy", {"version": "1", "deployment": "pets", "replicas": "1"})
    bob = api.as_(api.user("bob", "audio"))
    for path in ("/v1/models/{}", "/v1/deployments/{}", "/v1/models/{}/versions/1"):
        theirs = api.http.get(path.format("pets"), headers=bob)
        missing = api.http.get(path.format("nosuch"), headers=bob)
        assert theirs.status_code == missing.status_code == 404, (path, theirs.text)
        assert theirs.json()["error"]["message"] == missing.json()["error"]["message"].replace("nosuch", "pets")


def test_a_language_model_folder_shows_what_it_is_and_deploying_it_says_not_yet(api, tmp_path):
    from tests.models.hf_folder import parameters, write_tiny_llama

    folder = write_tiny_llama(tmp_path / "tiny")
    r = api.http.post("/v1/models/tiny/versions", json={"path": str(folder)}, headers=api.as_(api.admin))
    assert r.status_code == 201, r.text
    assert r.json()["signature"]["architecture"] == "LlamaForCausalLM"
    b = Browser(api, api.admin)
    page = b.get("/models/tiny").text
    assert 'id="deploy-later"' in page and 'id="deploy-form"' not in page
    assert re.search(rf'class="small muted lm-facts">LlamaForCausalLM · {parameters():,} parameters \(F32\) · '
                     r'context 128 tokens', page)
    r = b.post("/models/tiny/deploy", {"version": "1", "deployment": "tiny", "replicas": "1"})
    assert r.status_code == 422 and "language model (LlamaForCausalLM); serving runs image models for now" in r.text
