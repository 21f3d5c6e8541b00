"""Hot/cold tiers: stage and demote through the service, a move killed midway leaves the
version intact and readable, and recovery clears what interrupted ingests and moves left."""

import os
import signal
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest

from deeppod.datasets import service
from deeppod.datasets.shards import verify_checksums
from deeppod.datasets.tiers import Tiers, move, sweep
from deeppod.runtime.data import ImageDataset, ShardReader
from deeppod.store.models import DatasetVersion, Job, utcnow
from tests.datasets.images import class_folders
from tests.datasets.test_datasets import data_files, upload, version_dir


def _version(api, version_id):
    with api.ctx.sessions() as s:
        v = s.get(DatasetVersion, version_id)
        return v.tier, v.key


def test_stage_and_demote_move_between_tiers(api, tmp_path):
    upload(api, "pets", class_folders(tmp_path / "src"))
    r = api.http.post("/v1/datasets/pets@1/stage", params={"tier": "cold"}, headers=api.as_(api.admin))
    assert r.status_code == 200 and r.json()["tier"] == "cold"
    assert not version_dir(api, "pets").exists() and verify_checksums(version_dir(api, "pets", tier="cold")) == []
    assert _version(api, 1)[0] == "cold"
    r = api.http.post("/v1/datasets/pets@1/stage", headers=api.as_(api.admin))
    assert r.json() == {"ref": "pets@1", "tier": "hot", "path": str(version_dir(api, "pets"))}
    assert len(ImageDataset(r.json()["path"], None, size=32)) == 12
    # idle for longer than the policy allows: demoted, unless an active job names it
    plane = api.ctx.data
    with api.ctx.sessions.begin() as s:
        s.get(DatasetVersion, 1).last_used_at = utcnow() - timedelta(seconds=plane.cold_after_seconds + 5)
        job = Job(name="j", tenant_id=1, user_id=1, command=["x"], workdir="/", state="queued",
                  datasets=[{"ref": "pets@1", "version_id": 1, "env": "DEEPPOD_DATA_PETS"}])
        s.add(job)
    assert service.demote_idle(api.ctx.sessions, plane) == []
    with api.ctx.sessions.begin() as s:
        s.get(Job, job.id).state = "succeeded"
    assert service.demote_idle(api.ctx.sessions, plane) == ["default/pets/v1"]
    assert _version(api, 1)[0] == "cold"


def test_a_job_naming_a_cold_dataset_gets_it_staged(api, tmp_path):
    upload(api, "pets", class_folders(tmp_path / "src"))
    api.http.post("/v1/datasets/pets@1/stage", params={"tier": "cold"}, headers=api.as_(api.admin))
    r = api.http.post("/v1/jobs", json={"command": ["python", "-c", "pass"], "workdir": str(tmp_path),
                                        "datasets": ["pets@1"]}, headers=api.as_(api.admin))
    api.ctx.jobs.tick()
    launched = api.ctx.executor.launched[r.json()["id"]]
    assert launched.workers[0].env["DEEPPOD_DATA_PETS"] == str(version_dir(api, "pets"))
    assert _version(api, 1)[0] == "hot"


MOVER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from deeppod.datasets.tiers import Tiers, move
    tiers = Tiers(Path(sys.argv[1]), Path(sys.argv[2]))
    def slow(path):
        print("copied", path, flush=True)
        time.sleep(0.5)
    move(tiers, sys.argv[3], "hot", "cold", lambda: Path(sys.argv[4]).write_text("switched"), on_file=slow)
""")


@pytest.mark.slow
def test_a_move_killed_midway_leaves_the_version_intact(api, tmp_path):
    upload(api, "pets", class_folders(tmp_path / "src"))
    tiers = api.ctx.data.tiers
    key = "default/pets/v1"
    p = subprocess.Popen([sys.executable, "-c", MOVER, str(tiers.hot), str(tiers.cold), key, str(tmp_path / "sw")],
                         stdout=subprocess.PIPE, text=True)
    assert "copied" in p.stdout.readline()  # midway through the copy
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert not (tmp_path / "sw").exists()
    src = tiers.path("hot", key)
    assert verify_checksums(src) == [] and len(ShardReader(src)) == 12
    leftovers = list(tiers.path("cold", key).parent.glob(".*moving*"))
    assert leftovers, "the interrupted copy is where the sweep will find it"
    sweep(tiers, {key: "hot"})
    assert not list(tiers.path("cold", key).parent.glob(".*moving*"))
    # a copy that finished but whose switch never happened is also swept (the database says hot)
    move(tiers, key, "hot", "cold", switch=lambda: None)
    assert tiers.path("cold", key).exists() and not src.exists()


def test_a_corrupt_copy_is_refused_and_the_source_kept(tmp_path):
    tiers = Tiers(tmp_path / "hot", tmp_path / "cold")
    src = tiers.path("hot", "t/d/v1")
    src.mkdir(parents=True)
    (src / "a").write_bytes(b"abc")
    (src / "CHECKSUMS").write_text("0" * 64 + "  a\n")  # does not match
    try:
        move(tiers, "t/d/v1", "hot", "cold", switch=lambda: None)
        raise AssertionError("expected MoveFailed")
    except service.tiermod.MoveFailed as exc:
        assert "does not match its checksums" in str(exc)
    assert (src / "a").read_bytes() == b"abc" and not tiers.path("cold", "t/d/v1").exists()


def test_recovery_undoes_an_ingest_a_crash_interrupted(api, tmp_path):
    src = class_folders(tmp_path / "src")
    upload(api, "pets", src)
    before = data_files(api)
    plane = api.ctx.data
    # replay an ingest up to just before its database commit, then "crash"
    from deeppod.auth.service import Principal
    from deeppod.datasets import ingest
    from deeppod.datasets.policy import Policy
    from deeppod.sdk.sources import open_source

    s = open_source(str(class_folders(tmp_path / "src2", seed=5)))
    archive = tmp_path / "up.tar"
    archive.write_bytes(b"".join(s.chunks(None)))
    with api.ctx.sessions.begin() as sess:
        ds = service.create(sess, Principal(1, "admin", 1, "default", True), "pets")
        v = DatasetVersion(dataset_id=ds.id, version=2, state="ingesting", key="default/pets/v2", created_by=1)
        sess.add(v)
        sess.flush()
        vid = v.id
    staging = plane.tiers.staging / f"v{vid}"
    built = ingest.build(archive, staging / "version", plane.objects, Policy(), plane.limits)
    (staging / "journal").write_text("\n".join(built.new_objects))
    plane.objects.commit(staging)
    (staging / "version").rename(plane.tiers.path("hot", "default/pets/v2"))
    (plane.tiers.staging / "upload-deadbeef").write_bytes(b"half an upload")
    assert data_files(api) != before
    service.recover(api.ctx.sessions, plane)
    assert data_files(api) == before
    with api.ctx.sessions() as sess:
        assert [v.version for v in sess.query(DatasetVersion)] == [1]
