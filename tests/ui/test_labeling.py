"""Labeling (fake executor, no model): every image and every unlabeled file listed, images
served, corrections saved as the next version with lineage; bad saves refused whole."""

import io
import json
import zipfile

import pytest

from deeppod.runtime.trainers.digits import write_digits
from tests.ui.conftest import Browser

JSON = {"Accept": "application/json", "Content-Type": "application/json"}


@pytest.fixture
def digits(api, tmp_path):
    """digits@1: 1797 labeled images, and two files listed nowhere in labels.jsonl (no label)."""
    folder = write_digits(tmp_path / "digits")
    buf = io.BytesIO()
    rows = []
    with zipfile.ZipFile(buf, "w") as z:
        for p in sorted(folder.rglob("*.png")):
            rel = p.relative_to(folder).as_posix()
            z.write(p, rel)
            rows.append({"path": rel, "label": p.parent.name})
        unlabeled = rows.pop()["path"], rows.pop()["path"]
        z.writestr("labels.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    b = Browser(api, api.admin)
    r = b.http.post("/datasets/digits/upload", content=buf.getvalue(), headers={
        "X-CSRF-Token": b.csrf, "Accept": "application/json"})
    assert r.status_code == 200 and r.json()["quarantined"] == 2, r.text
    return b, unlabeled


def _save(b, labels, model=None):
    return b.http.post("/datasets/default/digits@1/label/save", content=json.dumps({"labels": labels, "model": model}),
                       headers={**JSON, "X-CSRF-Token": b.csrf})


def test_items_images_and_a_corrected_version_with_lineage(api, digits):
    b, unlabeled = digits
    assert 'id="open-labeling"' in b.get("/datasets/default/digits@1").text
    assert "DeepPod.labels.open" in b.get("/datasets/default/digits@1/label").text
    body = b.get("/datasets/default/digits@1/label/items.json").json()
    assert body["classes"] == [str(i) for i in range(10)] and len(body["items"]) == 1797
    keys = {k: (path, label) for k, path, label in body["items"]}
    assert {keys[f"q:{p}"] for p in unlabeled} == {(p, None) for p in unlabeled}
    first = body["items"][0]
    img = b.get(f"/datasets/default/digits@1/label/image?key={first[0]}")
    assert img.status_code == 200 and img.headers["content-type"] == "image/png"
    assert b.get(f"/datasets/default/digits@1/label/image?key=q:{unlabeled[0]}").content[:4] == b"\x89PNG"

    wrong = first[2]
    right = "7" if wrong != "7" else "1"
    r = _save(b, {first[0]: right, f"q:{unlabeled[0]}": "3"}, model="deployment digits (digits-cnn@2)")
    assert r.status_code == 200, r.text
    assert r.json()["ref"] == "digits@2" and r.json()["counts"] == {"relabeled": 1, "labeled": 1, "dropped": 0,
                                                                    "images": 1796}
    v2 = api.http.get("/v1/datasets/digits", headers=api.as_(api.admin)).json()["versions"][-1]
    assert v2["samples"] == 1796
    lineage = v2["lineage"]
    assert lineage["labeled_from"] == "digits@1" and lineage["labels_proposed_by"] == "deployment digits (digits-cnn@2)"
    new = {path: label for _, path, label in b.get("/datasets/default/digits@2/label/items.json").json()["items"]}
    assert new[first[1]] == right and new[unlabeled[0]] == "3" and unlabeled[1] in new and new[unlabeled[1]] is None
    old = {path: label for _, path, label in b.get("/datasets/default/digits@1/label/items.json").json()["items"]}
    assert old[first[1]] == wrong  # versions are immutable


@pytest.mark.parametrize("labels,says", [
    ({}, "nothing to save"),
    ({"i:999999": "3"}, "name no image"),
    ({"i:0": "a/b"}, "not a class name"),
    ({"i:0": ""}, "not a class name"),
])
def test_bad_saves_are_refused_and_make_no_version(api, digits, labels, says):
    b, _ = digits
    r = _save(b, labels)
    assert r.status_code == 422 and says in r.json()["error"]["message"], r.text
    assert len(api.http.get("/v1/datasets/digits", headers=api.as_(api.admin)).json()["versions"]) == 1


def test_proposals_need_a_serving_deployment_and_saves_need_the_csrf_secret(api, digits):
    b, _ = digits
    r = b.http.post("/datasets/default/digits@1/label/propose", content=json.dumps({"deployment": "nope",
                                                                                    "keys": ["i:0"]}),
                    headers={**JSON, "X-CSRF-Token": b.csrf})
    assert r.status_code == 404 and "is not serving" in r.json()["error"]["message"]
    r = b.http.post("/datasets/default/digits@1/label/propose", content=json.dumps({"deployment": "x", "keys": []}),
                    headers={**JSON, "X-CSRF-Token": b.csrf})
    assert r.status_code == 422
    r = b.http.post("/datasets/default/digits@1/label/save", content=json.dumps({"labels": {"i:0": "1"}}),
                    headers=JSON)
    assert r.status_code == 403


def test_another_tenant_can_neither_read_nor_relabel(api, digits):
    other = Browser(api, api.user("bob", "audio"))
    for path in ("/datasets/default/digits@1/label", "/datasets/default/digits@1/label/items.json",
                 "/datasets/default/digits@1/label/image?key=i:0"):
        assert other.get(path).status_code == 404, path


def test_a_champion_without_a_deployment_gets_one_for_the_proposals(api, digits, tmp_path):
    b, _ = digits
    folder = tmp_path / "art"
    folder.mkdir()
    (folder / "model.pt2").write_bytes(b"program")
    (folder / "weights.pt").write_bytes(b"weights")
    (folder / "signature.json").write_text(json.dumps({
        "classes": [str(i) for i in range(10)], "model": "small-cnn", "dataset": "digits@1",
        "input": {"kind": "image", "shape": [3, 8, 8], "mean": [0.5] * 3, "std": [0.2] * 3, "crop": "center"}}))
    api.http.post("/v1/models/digits-cnn/versions", json={"path": str(folder)}, headers=api.as_(api.admin))

    def serve(model):
        return b.http.post("/datasets/default/digits@1/label/serve", content=json.dumps({"model": model}),
                           headers={**JSON, "X-CSRF-Token": b.csrf})

    r = serve("digits-cnn")
    assert r.status_code == 422 and "no champion" in r.json()["error"]["message"]
    assert b.post("/models/digits-cnn/promote", {"version": "1"}).status_code == 200
    assert "digits-cnn champion (v1)" in b.get("/datasets/default/digits@1/label").text
    r = serve("digits-cnn")
    assert r.json() == {"deployment": "labeling-digits-cnn", "url": "/deployments/labeling-digits-cnn"}
    assert serve("digits-cnn").json()["deployment"] == "labeling-digits-cnn"  # reused, not a second one
    assert [d["name"] for d in api.http.get("/v1/deployments", headers=api.as_(api.admin)).json()] == \
        ["labeling-digits-cnn"]
    assert serve("nosuch").status_code == 404
    r = b.post("/deployments/labeling-digits-cnn/delete")
    assert r.status_code == 303 and api.http.get("/v1/deployments", headers=api.as_(api.admin)).json() == []
