"""Removing a dataset version: its files and the objects only it named go; a version in use stays."""


from deeppod.store.models import Model, ModelVersion
from tests.datasets.images import class_folders, image_bytes
from tests.datasets.test_datasets import data_files, upload, version_dir


def objects(api) -> int:
    return api.ctx.data.objects.count()


def test_rm_deletes_the_version_and_only_its_own_objects(api, tmp_path):
    src = class_folders(tmp_path / "src")
    assert upload(api, "pets", src).status_code == 201
    (src / "cat" / "extra.jpg").write_bytes(image_bytes(4242))
    assert upload(api, "pets", src).status_code == 201  # v2 = v1 + one image
    before = objects(api)
    h = api.as_(api.admin)
    r = api.http.delete("/v1/datasets/pets@2", headers=h)
    assert r.status_code == 200 and r.json() == {"ref": "pets@2", "objects_removed": 1}
    assert objects(api) == before - 1 and not version_dir(api, "pets", 2).exists()
    assert [v["version"] for v in api.http.get("/v1/datasets/pets", headers=h).json()["versions"]] == [1]
    r = api.http.delete("/v1/datasets/pets@1", headers=h)
    assert r.status_code == 200 and r.json()["objects_removed"] == 12 and objects(api) == 0
    assert not any(f.startswith("hot/") for f in data_files(api) if "/pets/" in f)


def test_rm_is_refused_while_a_job_or_a_model_uses_the_version(api, tmp_path):
    assert upload(api, "pets", class_folders(tmp_path / "src")).status_code == 201
    h = api.as_(api.admin)
    job = api.http.post("/v1/jobs", json={"command": ["python3", "-c", "pass"], "workdir": str(tmp_path),
                                          "datasets": ["pets@1"]}, headers=h).json()
    r = api.http.delete("/v1/datasets/pets@1", headers=h)
    assert r.status_code == 409 and f"job {job['id']} (queued)" in r.json()["error"]["message"]
    api.http.post(f"/v1/jobs/{job['id']}/cancel", headers=h)
    with api.ctx.sessions.begin() as s:
        m = Model(tenant_id=1, name="pets-clf", created_by=1)
        s.add(m)
        s.flush()
        s.add(ModelVersion(model_id=m.id, version=1, key="k", lineage={"datasets": ["pets@1"]}, created_by=1))
    r = api.http.delete("/v1/datasets/pets@1", headers=h)
    assert r.status_code == 409 and "model pets-clf@1" in r.json()["error"]["message"]
    assert version_dir(api, "pets", 1).is_dir()


def test_rm_needs_a_version_and_the_owning_tenant(api, tmp_path):
    assert upload(api, "pets", class_folders(tmp_path / "src")).status_code == 201
    r = api.http.delete("/v1/datasets/pets", headers=api.as_(api.admin))
    assert r.status_code == 422 and "pets@1" in r.json()["error"]["message"]
    bob = api.user("bob", "other")
    assert api.http.delete("/v1/datasets/pets@1", headers=api.as_(bob)).status_code == 404
    api.http.patch("/v1/datasets/pets", json={"shared": True}, headers=api.as_(api.admin))
    assert api.http.delete("/v1/datasets/pets@1", headers=api.as_(bob)).status_code == 403
