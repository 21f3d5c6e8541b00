"""The registry through the store (SQLite and PostgreSQL): register, aliases, evaluations,
promote, tenant scoping, bad artifacts."""

import json
import os
from pathlib import Path

import pytest
from sqlalchemy import select

from deeppod.auth.service import Principal, bootstrap, create_tenant, create_user
from deeppod.errors import Conflict, InvalidRequest, NotFound
from deeppod.models import service
from deeppod.models.compare import Figures, verdict
from deeppod.store.models import Job, JobMetric, ModelEvaluation

SIG = {"classes": ["cat", "dog"], "model": "small-cnn", "dataset": "pets@2", "hyperparameters": {"lr": 0.1},
       "metrics": {"val_accuracy": 0.9},
       "input": {"kind": "image", "shape": [3, 16, 16], "mean": [0.5] * 3, "std": [0.2] * 3, "crop": "center"}}


def artifact(folder: Path, sig=SIG, serving=b"program") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.pt2").write_bytes(serving)
    (folder / "weights.pt").write_bytes(b"weights")
    (folder / "signature.json").write_text(json.dumps(sig))
    return folder


def three_versions(s, who, root, jobs_dir, folder) -> None:
    """pets v1, v2 and v3, all from the same artifact folder."""
    for _ in range(3):
        service.register(s, who, "pets", root=root, jobs_dir=jobs_dir, path=str(folder))


@pytest.fixture
def env(sessions, tmp_path):
    with sessions.begin() as s:
        bootstrap(s)
        admin = Principal(1, "admin", 1, "default", True)
        create_tenant(s, admin, "vision")
        user, _ = create_user(s, admin, "ana", "vision")
        ana = Principal(user.id, "ana", user.tenant_id, "vision", False)
    return sessions, admin, ana, tmp_path / "models", tmp_path / "jobs"


def test_register_from_a_job_copies_the_artifact_with_lineage(env):
    sessions, admin, ana, root, jobs_dir = env
    with sessions.begin() as s:
        job = Job(name="train", tenant_id=ana.tenant_id, user_id=ana.user_id, state="succeeded",
                  command=["python", "-m", "trainer"], workdir="/", datasets=[{"ref": "pets@2", "version_id": 1,
                                                                                 "env": "DEEPPOD_DATA_PETS"}])
        s.add(job)
        s.flush()
        job_id = job.id
        s.add_all([JobMetric(job_id=job_id, name="accuracy", step=9, value=1.0),  # a last batch of one image
                   JobMetric(job_id=job_id, name="lr", step=9, value=0.1)])
    artifact(jobs_dir / str(job_id) / "model")
    with sessions.begin() as s:
        model, v = service.register(s, ana, "pets", root=root, jobs_dir=jobs_dir, job_id=job_id, aliases=["staging"])
        assert v.version == 1 and model.aliases == {"staging": 1}
        assert v.lineage["job_id"] == job_id
        assert v.lineage["dataset"] == "pets@2" and v.lineage["datasets"] == ["pets@2"]
        assert v.lineage["command"] == ["python", "-m", "trainer"] and v.metrics["val_accuracy"] == 0.9
        assert "accuracy" not in v.metrics  # issue 71: the last training batch's is not the model's
        assert (root / v.key / "model.pt2").read_bytes() == b"program" and len(v.sha256) == 64
    with sessions.begin() as s:
        _, v2 = service.register(s, ana, "pets", root=root, jobs_dir=jobs_dir,
                                 path=str(jobs_dir / str(job_id) / "model"))
        assert v2.version == 2
        m, latest = service.get_version(s, ana, "pets")
        assert latest.version == 2 and service.get_version(s, ana, "pets@staging")[1].version == 1
    with sessions() as s:  # another tenant does not see it
        with pytest.raises(NotFound):
            service.get_model(s, Principal(1, "bob", 1, "default", False), "pets")
        assert service.get_model(s, admin, "vision/pets").name == "pets"


@pytest.mark.parametrize("change, words", [
    ({"classes": ["one"]}, "at least two class"),
    ({"input": {"kind": "text"}}, "input.kind"),
    ({"input": {**SIG["input"], "shape": [3, 16, 8]}}, "input.shape"),
    ({"input": {**SIG["input"], "std": [0, 1, 1]}}, "zero"),
    ({"input": {**SIG["input"], "crop": "zoom"}}, "input.crop"),
])
def test_incomplete_signatures_are_refused_with_what_is_missing(env, change, words):
    sessions, _, ana, root, jobs_dir = env
    folder = artifact(jobs_dir / "x", {**SIG, **change})
    with sessions.begin() as s:
        with pytest.raises(InvalidRequest, match=words):
            service.register(s, ana, "pets", root=root, jobs_dir=jobs_dir, path=str(folder))
    assert not root.exists() or not any(root.rglob("model.pt2"))


def test_missing_files_and_bad_names(env, tmp_path):
    sessions, _, ana, root, jobs_dir = env
    (tmp_path / "empty").mkdir()
    with sessions.begin() as s:
        with pytest.raises(InvalidRequest, match="model.pt2"):
            service.register(s, ana, "pets", root=root, jobs_dir=jobs_dir, path=str(tmp_path / "empty"))
        with pytest.raises(InvalidRequest, match="absolute"):
            service.register(s, ana, "pets", root=root, jobs_dir=jobs_dir, path="relative/dir")
        with pytest.raises(InvalidRequest, match="name"):
            service.register(s, ana, "Bad Name", root=root, jobs_dir=jobs_dir, path=str(tmp_path / "empty"))
        with pytest.raises(InvalidRequest, match="--from-job"):
            service.register(s, ana, "pets", root=root, jobs_dir=jobs_dir)


def test_promote_needs_a_win_in_the_latest_comparison(env):
    sessions, _, ana, root, jobs_dir = env
    folder = artifact(jobs_dir / "a")
    with sessions.begin() as s:
        three_versions(s, ana, root, jobs_dir, folder)
        model, v1, why = service.promote(s, ana, "pets", "1")
        assert model.aliases["champion"] == 1 and "no champion" in why
        with pytest.raises(Conflict, match="no comparison"):
            service.promote(s, ana, "pets", "2")
        versions = {v.version: v for v in service.versions(s, model)}

        def evaluation(job, version, acc):
            s.add(ModelEvaluation(model_id=model.id, version_id=versions[version].id, job_id=job, dataset="pets@2",
                                  samples=100, accuracy=acc, per_class={}))
        evaluation(10, 1, 0.80)
        evaluation(10, 2, 0.75)
        s.flush()
        with pytest.raises(Conflict, match="below champion"):
            service.promote(s, ana, "pets", "2")
        evaluation(11, 1, 0.80)  # a newer comparison decides
        evaluation(11, 2, 0.85)
        s.flush()
        model.aliases = {**model.aliases, "challenger": 2}
        _, v, why = service.promote(s, ana, "pets", "challenger")
        assert v.version == 2 and "beats champion v1" in why and model.aliases == {"champion": 2}
        with pytest.raises(Conflict, match="already the champion"):
            service.promote(s, ana, "pets", "2")
        _, v, why = service.promote(s, ana, "pets", "3", force=True)
        assert v.version == 3 and "forced" in why


def test_verdict_is_strict():
    assert verdict(Figures(2, "d@1", 10, 0.9), Figures(1, "d@1", 10, 0.8))[0]
    assert not verdict(Figures(2, "d@1", 10, 0.8), Figures(1, "d@1", 10, 0.8))[0]
    with pytest.raises(ValueError):
        verdict(Figures(2, "d@1", 10, 0.9), Figures(1, "d@2", 10, 0.8))


def test_aliases(env):
    sessions, _, ana, root, jobs_dir = env
    folder = artifact(jobs_dir / "a")
    with sessions.begin() as s:
        service.register(s, ana, "pets", root=root, jobs_dir=jobs_dir, path=str(folder))
        assert service.set_alias(s, ana, "pets", "staging", "1").aliases == {"staging": 1}
        with pytest.raises(InvalidRequest):
            service.set_alias(s, ana, "pets", "latest", "1")
        with pytest.raises(NotFound, match="no version 7"):
            service.set_alias(s, ana, "pets", "x", "7")
        assert service.set_alias(s, ana, "pets", "staging", None).aliases == {}


def three_versions_and_data(s, ana, root, jobs_dir) -> None:
    """pets v1-v3, a node, and the held-out data a comparison scores them on (pets@2)."""
    from deeppod.cluster.gpus import LogicalProbe
    from deeppod.cluster.inventory import local_node
    from deeppod.cluster.service import register_node
    from deeppod.store.models import Dataset, DatasetVersion

    register_node(s, local_node(LogicalProbe(1), cpus=4, memory_mb=4096))
    ds = Dataset(tenant_id=ana.tenant_id, name="pets", created_by=ana.user_id)
    s.add(ds)
    s.flush()
    s.add(DatasetVersion(dataset_id=ds.id, version=2, state="ready", key="pets/2", created_by=ana.user_id))
    three_versions(s, ana, root, jobs_dir, artifact(jobs_dir / "a"))


def test_a_comparison_remembers_what_it_compares_without_reading_its_command(env):
    sessions, _, ana, root, jobs_dir = env
    with sessions.begin() as s:
        three_versions_and_data(s, ana, root, jobs_dir)
        job, va, vb = service.compare(s, ana, "pets", "3", "1", "pets@2", root=root, jobs_dir=jobs_dir,
                                      default_grace=5)
        job_id = job.id
    with sessions.begin() as s:
        s.get(Job, job_id).command = ["python", "-c", "pass"]  # what it compares is not parsed from here
    with sessions() as s:
        _, _, numbers, figures = service.comparison(s, ana, "pets", job_id)
        assert numbers == (3, 1) and figures == []
        other = Job(name="train", tenant_id=ana.tenant_id, user_id=ana.user_id, state="succeeded",
                    command=["python"], workdir="/", kind="evaluate")
        s.add(other)
        s.flush()
        with pytest.raises(NotFound, match="not a comparison"):
            service.comparison(s, ana, "pets", other.id)


def test_a_comparison_keeps_only_figures_for_its_two_versions_read_without_following_a_link(env, tmp_path):
    from deeppod.job_folder import JobFolder
    from deeppod.store.models import ModelVersion

    sessions, _, ana, root, jobs_dir = env
    with sessions.begin() as s:
        three_versions_and_data(s, ana, root, jobs_dir)
        job, va, vb = service.compare(s, ana, "pets", "1", "2", "pets@2", root=root, jobs_dir=jobs_dir,
                                      default_grace=5)
        job.state = "succeeded"
        ids = {v.version: v.id for v in s.scalars(select(ModelVersion))}
    out = JobFolder.of(jobs_dir, job.id).evaluation
    out.parent.mkdir(parents=True)
    figures = {"dataset": "pets@2", "results": [
        {"version_id": ids[v], "samples": 10, "accuracy": 0.5 + v / 10, "per_class": {}} for v in (1, 2, 3)]}
    planted = tmp_path / "elsewhere.json"  # what a link would have the server read
    planted.write_text(json.dumps(figures))
    os.symlink(planted, out)
    with sessions.begin() as s:
        assert service.absorb_evaluation(s, s.get(Job, job.id), jobs_dir) == 0
    out.unlink()
    out.write_text(json.dumps(figures))  # v3 is not what it was asked to compare
    with sessions.begin() as s:
        assert service.absorb_evaluation(s, s.get(Job, job.id), jobs_dir) == 2
        assert sorted(e.version_id for e in s.scalars(select(ModelEvaluation))) == [ids[1], ids[2]]
    out.write_text('{"results": [{"version_id": "x"}]}')
    with sessions.begin() as s:
        assert service.absorb_evaluation(s, s.get(Job, job.id), jobs_dir) == 0


def test_remove_a_version_or_a_model_but_not_what_a_deployment_serves(env):
    from deeppod.store.models import Deployment

    sessions, admin, ana, root, jobs_dir = env
    folder = artifact(jobs_dir / "a")
    with sessions.begin() as s:
        three_versions(s, ana, root, jobs_dir, folder)
        service.set_alias(s, ana, "pets", "staging", "2")
        model = service.get_model(s, ana, "pets")
        v3 = service.resolve(s, model, "3")
        s.add(ModelEvaluation(model_id=model.id, version_id=v3.id, job_id=5, dataset="d@1", samples=1,
                              accuracy=1.0, per_class={}))
        s.add(Deployment(tenant_id=ana.tenant_id, name="pets", model_id=model.id, version_id=v3.id, replicas=1,
                         gpus_per_replica=0, cpus_per_replica=1, max_batch=8, max_wait_ms=5, created_by=ana.user_id))
    with sessions.begin() as s:
        assert service.remove(s, ana, "pets@staging", root=root) == [2]
        assert service.get_model(s, ana, "pets").aliases == {}
    assert not (root / "vision" / "pets" / "v2").exists() and (root / "vision" / "pets" / "v1").exists()
    with sessions.begin() as s:
        with pytest.raises(Conflict, match="deployment pets serves"):
            service.remove(s, ana, "pets@3", root=root)
        with pytest.raises(Conflict, match="deployment pets serves"):
            service.remove(s, ana, "pets", root=root)
        with pytest.raises(NotFound):
            service.remove(s, Principal(1, "bob", 1, "default", False), "pets@1", root=root)
        s.delete(s.scalar(select(Deployment)))
    with sessions.begin() as s:
        assert service.remove(s, ana, "pets", root=root) == [1, 3]
        with pytest.raises(NotFound):
            service.get_model(s, ana, "pets")
        assert s.scalars(select(ModelEvaluation)).all() == []


def test_with_tenant_roots_a_path_elsewhere_is_refused_the_same_whether_it_exists_or_not(env, tmp_path):
    from deeppod.auth.paths import TenantRoots
    from deeppod.errors import Forbidden

    sessions, _, who, root, jobs_dir = env
    roots = TenantRoots([str(tmp_path / "work" / "{tenant}")])
    mine = artifact(tmp_path / "work" / who.tenant / "art")
    theirs = artifact(tmp_path / "work" / "other" / "art")
    with sessions.begin() as s:
        service.register(s, who, "pets", root=root, jobs_dir=jobs_dir, path=str(mine), roots=roots)
    answers = set()
    for elsewhere in (theirs, tmp_path / "work" / "other" / "nothing-here"):
        with sessions.begin() as s, pytest.raises(Forbidden) as refused:
            service.register(s, who, "pets", root=root, jobs_dir=jobs_dir, path=str(elsewhere), roots=roots)
        answers.add(str(refused.value).replace(str(elsewhere), "PATH"))
    assert len(answers) == 1  # nothing says which exists


def test_an_artifact_file_that_is_a_link_is_refused(env, tmp_path):
    art = artifact(tmp_path / "art")
    (art / "weights.pt").unlink()
    (art / "weights.pt").symlink_to("/etc/hostname")
    sessions, _, ana, root, jobs_dir = env
    with sessions.begin() as s, pytest.raises(InvalidRequest, match="not links"):
        service.register(s, ana, "pets", root=root, jobs_dir=jobs_dir, path=str(art))


def test_a_sparse_model_file_is_refused_not_written_out_whole(env, tmp_path):
    """Issue 70: a job's 2 GiB sparse model.pt2 (nothing allocated) became 2.1 GB that root wrote
    into the registry; a 1 TB one would fill the server's disk."""
    art = artifact(tmp_path / "art")
    with open(art / "model.pt2", "wb") as f:
        f.truncate(64 << 20)  # 64 MiB long, nothing written
    sessions, _, ana, root, jobs_dir = env
    with sessions.begin() as s, pytest.raises(InvalidRequest, match="is a sparse file"):
        service.register(s, ana, "pets", root=root, jobs_dir=jobs_dir, path=str(art))
    assert not any(root.rglob("model.pt2"))  # nothing was copied, nothing left behind


def test_a_model_over_the_tenants_storage_quota_is_refused_and_counts_once_registered(env, tmp_path):
    from deeppod.errors import Forbidden
    from deeppod.jobs import quotas
    from deeppod.plans.service import apply_plan
    from deeppod.store.models import Tenant

    sessions, admin, ana, root, jobs_dir = env
    with sessions.begin() as s:
        apply_plan(s, admin, {"tenants": [{"name": "vision", "guaranteed": 0, "storage_gb": 0.001}]})  # 1 MB
    small = artifact(tmp_path / "small", serving=os.urandom(100_000))
    big = artifact(tmp_path / "big", serving=os.urandom(2_000_000))
    with sessions.begin() as s, pytest.raises(Forbidden, match="left of the tenant's storage quota") as e:
        service.register(s, ana, "pets", root=root, jobs_dir=jobs_dir, path=str(big))
    assert e.value.code == "over_quota" and not any(root.rglob("model.pt2"))
    with sessions.begin() as s:
        service.register(s, ana, "pets", root=root, jobs_dir=jobs_dir, path=str(small))
    quotas.StorageMeter(sessions, jobs_dir).tick()  # the registry's copy counts against the quota
    with sessions() as s:
        assert s.scalar(select(Tenant.storage_bytes).where(Tenant.name == "vision")) >= 100_000
