"""Datasets through the API: every source kind, quarantine, dedup, lineage, policies,
limits, refusals that write nothing, search and tenant scoping, jobs naming datasets."""

import io
import json
import os
import tarfile
import zipfile
from pathlib import Path

import pytest
from PIL import Image

from deeppod.errors import InvalidRequest
from deeppod.runtime.data import ShardReader, iter_shard
from deeppod.sdk.sources import open_source
from tests.datasets.images import class_folders, image_bytes, truncated_jpeg


def upload(api, name, src_path, token=None, **params):
    s = open_source(str(src_path))
    q = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in params.items()}
    body = b"".join(s.chunks(None))
    assert len(body) == s.length  # what the client sends as the Content-Length
    return api.http.post(f"/v1/datasets/{name}/versions", content=body, params=q,
                         headers={**api.as_(token or api.admin), "content-type": s.content_type})


def data_files(api) -> list[str]:
    root = api.ctx.settings.home / "data"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def version_dir(api, name, v=1, owner="default", tier="hot") -> Path:
    return api.ctx.data.tiers.path(tier, f"{owner}/{name}/v{v}")


def test_a_source_knows_its_length_ahead_long_names_and_archives_too(tmp_path):
    src = class_folders(tmp_path / "src", per_class=2)
    deep = src / ("n" * 120) / ("é" * 90)
    deep.mkdir(parents=True)
    (deep / ("x" * 150 + ".jpg")).write_bytes(image_bytes(3))
    folder = open_source(str(src))
    assert len(b"".join(folder.chunks(None))) == folder.length
    archive = tmp_path / "a.tar"
    archive.write_bytes(b"".join(folder.chunks(None)))
    a = open_source(str(archive))
    assert a.length == archive.stat().st_size and b"".join(a.chunks(None)) == archive.read_bytes()
    chunks = a.chunks(None)
    next(chunks)
    with open(archive, "ab") as f:  # it grew while it was being sent: not sent cut short
        f.write(b"more")
    with pytest.raises(InvalidRequest, match="changed size while it was being sent"):
        list(chunks)


def test_folder_ingest_quarantines_bad_files_and_builds_shards(api, tmp_path):
    src = class_folders(tmp_path / "src")
    (src / "cat" / "broken.jpg").write_bytes(truncated_jpeg())
    (src / "dog" / "notes.txt").write_text("not an image")
    (src / "loose.jpg").write_bytes(image_bytes(7))
    (src / ".DS_Store").write_bytes(b"junk")
    r = upload(api, "pets", src, policy={"val": 0.25}, tags={"kind": "animals"}, source="folder src")
    assert r.status_code == 201, r.text
    v = r.json()["versions"][0]
    assert v["ref"] == "pets@1" and v["samples"] == 12 and v["classes"] == ["cat", "dog"]
    reasons = {q["path"]: q["reason"] for q in v["quarantined"]}
    assert set(reasons) == {"cat/broken.jpg", "dog/notes.txt", "loose.jpg"}
    assert "truncated" in reasons["cat/broken.jpg"] and "not an image" in reasons["dog/notes.txt"]
    assert "class folder" in reasons["loose.jpg"]
    assert v["stats"]["per_class"] == {"cat": 6, "dog": 6} and sum(v["stats"]["per_split"].values()) == 12
    # a quarter of each class's 7 files offered, 2 (one of them may be the broken one, quarantined)
    assert 3 <= v["stats"]["per_split"]["val"] <= 4
    assert v["stats"]["formats"] == {"JPEG": 8, "PNG": 4}
    assert v["lineage"]["source"] == "folder src" and v["lineage"]["parent"] is None
    d = version_dir(api, "pets")
    assert (d / "quarantine" / "cat" / "broken.jpg").read_bytes() == truncated_jpeg()
    manifest = [json.loads(line) for line in (d / "manifest.jsonl").open()]
    assert {m["path"] for m in manifest} == {f"{c}/{c}{i}.{'png' if i % 3 == 2 else 'jpg'}"
                                             for c in ("cat", "dog") for i in range(6)}
    assert all(set(m) == {"path", "label", "bytes", "sha256", "md5", "width", "height", "split"} for m in manifest)
    # shards: random access by index and a sequential read give the same bytes, in manifest order
    reader = ShardReader(d)
    assert len(reader) == 12
    sequential = list(iter_shard(d / "shards" / "shard-00000.dps"))
    for i, m in enumerate(manifest):
        data, label = reader.read(i)
        assert (bytes(data), label) == (sequential[i][1], sequential[i][0])
        assert reader.classes[label] == m["label"] and len(data) == m["bytes"]
    assert len(ShardReader(d, "train")) + len(ShardReader(d, "val")) == 12


def test_reingest_dedups_and_records_lineage(api, tmp_path):
    src = class_folders(tmp_path / "src")
    assert upload(api, "pets", src).status_code == 201
    objects = api.ctx.data.objects.count()
    assert objects == 12
    (src / "cat" / "new.jpg").write_bytes(image_bytes(500))
    (src / "dog" / "copy.jpg").write_bytes((src / "dog" / "dog0.jpg").read_bytes())  # same content again
    r = upload(api, "pets", src)
    v2 = r.json()["versions"][1]
    assert v2["ref"] == "pets@2" and v2["samples"] == 14 and v2["lineage"]["parent"] == 1
    assert v2["lineage"]["new_objects"] == 1 and v2["lineage"]["deduplicated"] == 13
    assert api.ctx.data.objects.count() == 13


def test_labels_csv_zip_and_tar_gz_sources(api, tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    for i in range(4):
        (flat / f"img{i}.png").write_bytes(image_bytes(i, fmt="PNG"))
    (flat / "labels.csv").write_text("path,label\n" + "".join(f"img{i}.png,{'yes' if i % 2 else 'no'}\n"
                                                            for i in range(3)) + "gone.png,yes\n")
    z = tmp_path / "flat.zip"
    with zipfile.ZipFile(z, "w") as zf:
        for f in flat.iterdir():
            zf.write(f, f"flat/{f.name}")
    r = upload(api, "answers", z)
    assert r.status_code == 201, r.text
    v = r.json()["versions"][0]
    assert v["classes"] == ["no", "yes"] and v["samples"] == 3
    assert [q["path"] for q in v["quarantined"]] == ["img3.png"]
    assert v["labels_without_file"] == ["gone.png"]  # a row naming no file is reported
    tgz = tmp_path / "pets.tar.gz"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(class_folders(tmp_path / "src"), arcname="pets")
    r = upload(api, "pets", tgz)
    assert r.status_code == 201 and r.json()["versions"][0]["samples"] == 12


def test_policy_resize_and_tiling_apply_to_new_versions(api, tmp_path):
    src = class_folders(tmp_path / "src", per_class=2, size=(300, 160))
    assert upload(api, "big", src).status_code == 201
    r = api.http.put("/v1/datasets/big/policy", json={"policy": {"resize": "short:80", "format": "jpeg"}},
                     headers=api.as_(api.admin))
    assert r.status_code == 200 and r.json()["policy"]["resize"] == "short:80"
    v2 = upload(api, "big", src).json()["versions"][1]
    assert v2["stats"]["width"] == {"min": 150, "max": 150, "mean": 150.0} and v2["stats"]["height"]["max"] == 80
    assert v2["lineage"]["policy"]["resize"] == "short:80"
    r = api.http.put("/v1/datasets/big/policy", json={"policy": {"tile": 64}, "replace": True},
                     headers=api.as_(api.admin))
    v3 = upload(api, "big", src).json()["versions"][2]
    assert v3["samples"] == 4 * 15  # 300x160 in 64-pixel tiles: 5 x 3
    r = api.http.put("/v1/datasets/big/policy", json={"policy": {"resize": "huge"}}, headers=api.as_(api.admin))
    assert r.status_code == 422 and "max:N or short:N" in r.json()["error"]["message"]


def test_refused_uploads_write_nothing(api, tmp_path):
    before = data_files(api)
    slip = tmp_path / "slip.zip"
    with zipfile.ZipFile(slip, "w") as zf:
        zf.writestr("cat/a.jpg", image_bytes(1))
        zf.writestr("../../../etc/cron.d/evil", b"* * * * * root rm -rf /")
    r = upload(api, "evil", slip)
    assert r.status_code == 422 and "zip-slip" in r.json()["error"]["message"]
    r = api.http.post("/v1/datasets/evil/versions", content=b"", headers=api.as_(api.admin))
    assert r.status_code == 422 and "empty" in r.json()["error"]["message"]
    r = api.http.post("/v1/datasets/evil/versions", content=b"hello" * 300, headers=api.as_(api.admin))
    assert r.status_code == 422 and "not a tar" in r.json()["error"]["message"]
    only_bad = tmp_path / "bad"
    (only_bad / "cat").mkdir(parents=True)
    (only_bad / "cat" / "x.jpg").write_bytes(truncated_jpeg())
    r = upload(api, "evil", only_bad)
    assert r.status_code == 422 and "no image could be ingested" in r.json()["error"]["message"]
    r = upload(api, "Bad Name", only_bad)
    assert r.status_code == 422
    assert data_files(api) == before
    assert api.http.get("/v1/datasets/evil", headers=api.as_(api.admin)).status_code == 404  # no empty dataset left


def test_size_limits(api, tmp_path):
    src = class_folders(tmp_path / "src", per_class=2)
    noise = io.BytesIO()
    Image.frombytes("RGB", (300, 300), os.urandom(300 * 300 * 3)).save(noise, format="PNG")
    (src / "cat" / "huge.png").write_bytes(noise.getvalue())
    api.ctx.data.limits.max_file_bytes = 100_000
    v = upload(api, "pets", src).json()["versions"][0]
    assert [q["path"] for q in v["quarantined"]] == ["cat/huge.png"]
    assert "per-file limit" in v["quarantined"][0]["reason"]
    before = data_files(api)
    api.ctx.data.limits.max_ingest_bytes = 20_000
    r = upload(api, "pets", src)
    assert r.status_code == 413 and "per-ingest limit" in r.json()["error"]["message"]
    assert data_files(api) == before


def test_search_tags_sharing_and_tenant_scoping(api, tmp_path):
    alice, bob = api.user("alice", "teama"), api.user("bob", "teamb")
    src = class_folders(tmp_path / "src")
    assert upload(api, "xrays", src, token=alice, tags={"xray": "", "site": "lyon"}).status_code == 201
    assert upload(api, "cats", src, token=bob).status_code == 201
    names = lambda tok, q="": [d["name"] for d in api.http.get("/v1/datasets", params={"q": q},
                                                                headers=api.as_(tok)).json()]
    assert names(alice) == ["xrays"] and names(bob) == ["cats"]
    assert names(api.admin, "tag:xray owner:teama classes>1 size<2GB") == ["xrays"]
    assert names(api.admin, "classes>2") == []
    r = api.http.get("/v1/datasets/xrays", headers=api.as_(bob))
    assert r.status_code == 404
    r = api.http.patch("/v1/datasets/xrays", json={"shared": True, "tags": {"reviewed": "yes"}, "untag": ["site"]},
                       headers=api.as_(alice))
    assert r.status_code == 200 and r.json()["tags"] == {"xray": "", "reviewed": "yes"}
    assert names(bob) == ["cats", "xrays"] or names(bob) == ["xrays", "cats"]
    assert api.http.get("/v1/datasets/teama/xrays@1", headers=api.as_(bob)).status_code == 200
    r = api.http.patch("/v1/datasets/teama/xrays", json={"description": "mine now"}, headers=api.as_(bob))
    assert r.status_code in (403, 404)
    r = api.http.post("/v1/datasets/xrays/versions", content=b"x", headers=api.as_(bob))
    # bob's own namespace: a new dataset of his, refused only because the body is not an archive
    assert r.status_code == 422
    assert api.http.get("/v1/datasets", params={"q": "colour:red"}, headers=api.as_(bob)).status_code == 422


def test_jobs_pin_their_datasets(api, tmp_path):
    src = class_folders(tmp_path / "src")
    upload(api, "pets", src)
    upload(api, "pets", src)
    body = {"command": ["python", "-c", "pass"], "workdir": str(tmp_path)}
    r = api.http.post("/v1/jobs", json={**body, "datasets": ["pets"]}, headers=api.as_(api.admin))
    assert r.status_code == 201, r.text
    assert r.json()["datasets"] == [{"ref": "pets@2", "version_id": 2, "env": "DEEPPOD_DATA_PETS"}]
    r = api.http.post("/v1/jobs", json={**body, "datasets": ["pets@7"]}, headers=api.as_(api.admin))
    assert r.status_code == 404 and "no version 7" in r.json()["error"]["message"]
    r = api.http.post("/v1/jobs", json={**body, "datasets": ["nope"]}, headers=api.as_(api.admin))
    assert r.status_code == 404 and "deeppod data ls" in r.json()["error"]["message"]


def test_unknown_datasets_and_versions_are_refused_with_the_choices(api, tmp_path):
    assert upload(api, "pets", class_folders(tmp_path / "src")).status_code == 201
    h = api.as_(api.admin)
    r = api.http.get("/v1/datasets/pest", headers=h)
    assert r.status_code == 404 and "pets" in r.json()["error"]["message"]
    job = {"command": ["python3", "-c", "pass"], "workdir": str(tmp_path), "datasets": ["pets@7"]}
    r = api.http.post("/v1/jobs", json=job, headers=h)
    assert r.status_code == 404 and "its versions: 1" in r.json()["error"]["message"]


def test_what_another_tenant_stores_shows_in_neither_lineage_nor_the_store(api, tmp_path):
    """Issue 70: an ingest's lineage said "deduplicated" when another tenant held the same bytes,
    so a tenant could test whether anyone holds a file. Identical bytes are stored once still."""
    src = class_folders(tmp_path / "src")
    assert upload(api, "pets", src).status_code == 201
    stored = api.ctx.data.objects.count()
    red = api.user("eve", "red")
    r = upload(api, "probe", src, token=red)
    assert r.status_code == 201, r.text
    lineage = r.json()["versions"][0]["lineage"]
    assert lineage["new_objects"] == 12 and lineage["deduplicated"] == 0  # as if nobody held them
    assert api.ctx.data.objects.count() == stored  # and yet stored once
    staging = api.ctx.data.tiers.staging
    assert not staging.exists() or not any(staging.iterdir())  # nothing left of what was written and dropped
