"""Datasets through the store: versions (ingest, recover), catalog, policies, tiers."""

from __future__ import annotations

import json
import logging
import shutil
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, sessionmaker

from deeppod import refs
from deeppod.auth import scope
from deeppod.auth.service import Principal, check_name
from deeppod.contract import ACTIVE_STATES, dataset_env_key
from deeppod.datasets import catalog, ingest, tokens
from deeppod.datasets import tiers as tiermod
from deeppod.datasets.objects import ObjectStore
from deeppod.datasets.policy import Policy
from deeppod.datasets.tiers import Tiers
from deeppod.errors import Conflict, Forbidden, InvalidRequest, NotFound
from deeppod.store.models import Dataset, DatasetVersion, Job, Model, ModelVersion, Tenant, utcnow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ref:
    owner: str | None
    name: str
    version: int | None  # None: the latest ready version


def parse_ref(ref: str) -> Ref:
    """A dataset reference: its selector, if any, is a version number or 'latest'."""
    how = "NAME, NAME@VERSION or TENANT/NAME@VERSION (e.g. digits@2)"
    r = refs.parse_ref(ref, how)
    if r.selector not in (None, "latest") and not r.selector.isdigit():
        raise InvalidRequest(f"dataset {ref!r}: the version must be a number or 'latest'; write {how}")
    return Ref(r.owner, r.name, None if r.selector in (None, "latest") else int(r.selector))


# -- lookups -----------------------------------------------------------------------------

def _visible(query, principal: Principal):
    """Yours, and those shared with everyone (all of them for an administrator)."""
    return scope.visible(query, Dataset, principal, shared=Dataset.shared.is_(True))


def get_dataset(session: Session, principal: Principal, ref: Ref | str, *, write: bool = False) -> Dataset:
    ref = parse_ref(ref) if isinstance(ref, str) else ref
    q = select(Dataset).join(Tenant, Dataset.tenant_id == Tenant.id).where(Dataset.name == ref.name)
    if ref.owner:
        q = q.where(Tenant.name == ref.owner)
    found = list(session.scalars(_visible(q, principal).order_by(Dataset.id)))
    if len(found) > 1:  # own first, then an unambiguous shared one
        own = [d for d in found if scope.owns(principal, d)]
        if len(own) == 1:
            found = own
        else:
            owners = ", ".join(sorted(session.get(Tenant, d.tenant_id).name for d in found))
            raise InvalidRequest(f"several datasets are called {ref.name!r} (tenants {owners}): "
                                 f"write TENANT/{ref.name}")
    if not found:
        names = sorted(set(session.scalars(_visible(select(Dataset.name), principal))))
        shown = ", ".join(names[:20]) + (" ..." if len(names) > 20 else "") if names else "none yet"
        raise NotFound(f"no such dataset {ref.name!r} that you can see (yours and shared ones: {shown}; "
                       "'deeppod data ls' lists them); ingest one with 'deeppod data ingest NAME FOLDER'")
    ds = found[0]
    if write and not scope.may_see(principal, ds):
        raise Forbidden(f"dataset {ref.name!r} belongs to another tenant; you can read it but not change it")
    return ds


def get_version(session: Session, principal: Principal, ref: str) -> tuple[Dataset, DatasetVersion]:
    r = parse_ref(ref)
    ds = get_dataset(session, principal, r)
    q = select(DatasetVersion).where(DatasetVersion.dataset_id == ds.id, DatasetVersion.state == "ready")
    if r.version is None:
        v = session.scalars(q.order_by(DatasetVersion.version.desc()).limit(1)).first()
        if v is None:
            raise NotFound(f"dataset {ds.name!r} has no versions yet: ingest one with 'deeppod data ingest'")
    else:
        v = session.scalars(q.where(DatasetVersion.version == r.version)).first()
        if v is None:
            numbers = ", ".join(str(x.version) for x in versions(session, ds)) or "none"
            raise NotFound(f"dataset {ds.name!r} has no version {r.version} (its versions: {numbers})")
    return ds, v


def versions(session: Session, ds: Dataset) -> list[DatasetVersion]:
    return list(session.scalars(select(DatasetVersion).where(DatasetVersion.dataset_id == ds.id,
                                                             DatasetVersion.state == "ready")
                                .order_by(DatasetVersion.version)))


def owner_name(session: Session, ds: Dataset) -> str:
    """Its owner: the tenant (as for models and in TENANT/NAME references)."""
    return session.get(Tenant, ds.tenant_id).name


# -- catalog ------------------------------------------------------------------------------

def search(session: Session, principal: Principal, query: str = "") -> list[tuple[Dataset, str, list[DatasetVersion]]]:
    terms = catalog.parse(query)
    out = []
    rows = session.execute(_visible(select(Dataset, Tenant.name).join(Tenant, Dataset.tenant_id == Tenant.id)
                                    .order_by(Tenant.name, Dataset.name), principal))
    for ds, owner in rows:
        vs = versions(session, ds)
        latest = vs[-1] if vs else None
        entry = {"name": ds.name, "owner": owner, "description": ds.description, "shared": ds.shared,
                 "tags": ds.tags or {}, "classes": len(latest.classes) if latest else 0,
                 "size": latest.bytes if latest else 0, "samples": latest.samples if latest else 0,
                 "versions": len(vs)}
        if catalog.matches(entry, terms):
            out.append((ds, owner, vs))
    return out


def update(session: Session, principal: Principal, name: str, *, description: str | None = None,
           shared: bool | None = None, tags: dict | None = None, untag: list[str] | None = None,
           meta: dict | None = None) -> Dataset:
    ds = get_dataset(session, principal, name, write=True)
    if description is not None:
        ds.description = description
    if shared is not None:
        ds.shared = shared
    if tags or untag:
        new = dict(ds.tags or {})
        new.update({k: str(v) for k, v in (tags or {}).items()})
        for k in untag or []:
            new.pop(k, None)
        ds.tags = new
    if meta:
        ds.meta = {**(ds.meta or {}), **meta}
    return ds


def set_policy(session: Session, principal: Principal, name: str, raw: dict, *, replace: bool = False) -> Dataset:
    ds = get_dataset(session, principal, name, write=True)
    merged = raw if replace else {**(ds.policy or {}), **raw}
    ds.policy = Policy.parse(merged).to_dict()
    return ds


def create(session: Session, principal: Principal, name: str, **kw) -> Dataset:
    check_name("dataset", name)
    existing = session.scalars(scope.own(select(Dataset).where(Dataset.name == name), Dataset, principal)).first()
    if existing:
        return existing
    ds = Dataset(tenant_id=principal.tenant_id, name=name, created_by=principal.user_id, **kw)
    session.add(ds)
    session.flush()
    return ds


# -- ingest -------------------------------------------------------------------------------

@dataclass
class DataPlane:
    """What the data features need besides the database: storage roots and limits."""

    tiers: Tiers
    limits: ingest.Limits
    cold_after_seconds: float
    server_id: str | None = None  # recorded on the versions this server's API ingests

    @property
    def objects(self) -> ObjectStore:
        return ObjectStore(self.tiers.objects)

    def spool(self) -> Path:
        self.tiers.staging.mkdir(parents=True, exist_ok=True)
        return self.tiers.staging / f"upload-{uuid.uuid4().hex}"


_commit_lock = threading.Lock()


def ingest_upload(sessions: sessionmaker, plane: DataPlane, principal: Principal, name: str, upload: Path, *,
                  policy: dict | None = None, tags: dict | None = None, description: str | None = None,
                  source: str = "upload", lineage: dict | None = None) -> int:
    """Build a new version from an uploaded archive; returns its id. All or nothing.
    ``lineage``: more to record of where it came from (a labeling: the version and the model)."""
    check_name("dataset", name)
    with sessions.begin() as s:
        new = s.scalar(scope.own(select(Dataset.id).where(Dataset.name == name), Dataset, principal)) is None
        ds = create(s, principal, name)
        if not scope.may_see(principal, ds):
            raise Forbidden(f"dataset {name!r} belongs to another tenant")
        if policy:
            ds.policy = Policy.parse({**(ds.policy or {}), **policy}).to_dict()
        applied = Policy.parse(ds.policy)
        if tags:
            ds.tags = {**(ds.tags or {}), **{k: str(v) for k, v in tags.items()}}
        if description is not None:
            ds.description = description
        parent = s.scalar(select(func.max(DatasetVersion.version)).where(
            DatasetVersion.dataset_id == ds.id, DatasetVersion.state == "ready"))
        before = s.scalar(select(DatasetVersion).where(DatasetVersion.dataset_id == ds.id,
                                                       DatasetVersion.version == parent)) if parent else None
        parent_manifest = plane.tiers.path(before.tier, before.key) / "manifest.jsonl" if before else None
        parent_kind = (before.stats or {}).get("kind", "image") if before else None
        number = (s.scalar(select(func.max(DatasetVersion.version)).where(DatasetVersion.dataset_id == ds.id)) or 0) + 1
        owner = owner_name(s, ds)
        v = DatasetVersion(dataset_id=ds.id, version=number, state="ingesting", tier="hot",
                           key=f"{owner}/{name}/v{number}", created_by=principal.user_id,
                           ingest_server=plane.server_id,
                           lineage={**(lineage or {}), "source": source, "policy": applied.to_dict(), "parent": parent,
                                    "by": principal.user})
        s.add(v)
        s.flush()
        version_id, key, dataset_id = v.id, v.key, ds.id
    staging = plane.tiers.staging / f"v{version_id}"
    final = plane.tiers.path("hot", key)
    try:
        if staging.exists():
            shutil.rmtree(staging)
        built = ingest.build(upload, staging / "version", plane.objects, applied, plane.limits)
        kind = built.stats.get("kind", "image")
        if built.samples == 0:
            raise InvalidRequest(f"no {'example' if kind == 'text' else 'image'} could be ingested: "
                                 + _first_reasons(built.report) + "; fix the files and ingest again")
        if parent_kind is not None and parent_kind != kind:
            raise InvalidRequest(f"dataset {name!r} holds {parent_kind} data and this upload is {kind} "
                                 "(JSON Lines files are text, anything else images): ingest it as another dataset")
        (staging / "journal").write_text("\n".join(built.new_objects))
        new = _new_since(staging / "version" / "manifest.jsonl", parent_manifest)  # before the writer's turn
        with _commit_lock:  # objects: rename into the store; version: rename into place; then the row
            plane.objects.commit(staging)
            final.parent.mkdir(parents=True, exist_ok=True)
            (staging / "version").rename(final)
            with sessions.begin() as s:
                v = s.get(DatasetVersion, version_id)
                v.state, v.samples, v.bytes, v.classes = "ready", built.samples, built.bytes, built.classes
                v.stats, v.report = built.stats, built.report
                v.lineage = {**v.lineage, **({"duplicates_dropped": built.report.get("duplicates", 0)} if kind == "text"
                                             else {"new_objects": new, "deduplicated": built.samples - new})}
        shutil.rmtree(staging, ignore_errors=True)
        return version_id
    except BaseException:
        _abort(sessions, plane, version_id, key)
        if new:  # a first ingest that failed leaves no empty dataset behind
            with sessions.begin() as s:
                if s.scalar(select(func.count()).where(DatasetVersion.dataset_id == dataset_id)) == 0:
                    s.execute(delete(Dataset).where(Dataset.id == dataset_id))
        raise


def _first_reasons(report: dict) -> str:
    q = report.get("quarantined") or []
    return "; ".join(f"{x['path']}: {x['reason']}" for x in q[:3]) or "the archive holds no files"


def _referenced(sessions: sessionmaker, plane: DataPlane, shas: set[str]) -> set[str]:
    """Which of ``shas`` a ready version's manifest names (slow; only after a crash)."""
    found = set()
    with sessions() as s:
        rows = list(s.scalars(select(DatasetVersion).where(DatasetVersion.state == "ready")))
    for v in rows:
        manifest = plane.tiers.path(v.tier, v.key) / "manifest.jsonl"
        if manifest.is_file():
            with open(manifest) as f:
                for line in f:
                    sha = json.loads(line)["sha256"]
                    if sha in shas:
                        found.add(sha)
    return found


def _shas(manifest: Path | None) -> set[str]:
    if manifest is None or not manifest.is_file():
        return set()
    with open(manifest) as f:
        return {json.loads(line)["sha256"] for line in f}


def _new_since(manifest: Path, parent: Path | None) -> int:
    """Contents new in this version, from the tenant's own datasets (never another tenant's bytes)."""
    return len(_shas(manifest) - _shas(parent))


def _abort(sessions: sessionmaker, plane: DataPlane, version_id: int, key: str) -> None:
    staging = plane.tiers.staging / f"v{version_id}"
    journal = staging / "journal"
    if journal.is_file():
        shas = set(filter(None, journal.read_text().splitlines()))
        plane.objects.remove(shas - _referenced(sessions, plane, shas))
    shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(plane.tiers.path("hot", key), ignore_errors=True)
    with sessions.begin() as s:
        v = s.get(DatasetVersion, version_id)
        if v is not None and v.state == "ingesting":
            s.delete(v)


def recover(sessions: sessionmaker, plane: DataPlane, live: set[str] | None = None) -> None:
    """Undo ingests a crash interrupted and remove what moves left over. ``live``: the other
    servers still running (a failover control plane), whose ingests and moves may be under
    way: then only the ingests of servers that died are undone. None: no other server runs."""
    with sessions() as s:
        broken = [(v.id, v.key) for v in s.scalars(select(DatasetVersion).where(DatasetVersion.state == "ingesting"))
                  if live is None or v.ingest_server not in live]
    for version_id, key in broken:
        log.warning("removing dataset version %s: its ingest was interrupted", key)
        _abort(sessions, plane, version_id, key)
    if live is not None:  # the leftovers below have no owner: swept only when no other server runs
        return
    if plane.tiers.staging.is_dir():
        shutil.rmtree(plane.tiers.staging, ignore_errors=True)
    with sessions() as s:
        live = {v.key: v.tier for v in s.scalars(select(DatasetVersion))}
    tiermod.sweep(plane.tiers, live)


# -- tiers --------------------------------------------------------------------------------

_move_locks: dict[int, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock(version_id: int) -> threading.Lock:
    with _locks_guard:
        return _move_locks.setdefault(version_id, threading.Lock())


def move_version(sessions: sessionmaker, plane: DataPlane, version_id: int, tier: str, *, on_file=None) -> str:
    if tier not in tiermod.TIERS:
        raise InvalidRequest(f"tier {tier!r}: use hot or cold")
    with _lock(version_id):
        with sessions() as s:
            v = s.get(DatasetVersion, version_id)
            current, key = v.tier, v.key
        if current != tier:
            def switch():
                with sessions.begin() as s2:
                    s2.get(DatasetVersion, version_id).tier = tier

            tiermod.move(plane.tiers, key, current, tier, switch, on_file=on_file)
            log.info("dataset version %s moved %s -> %s", key, current, tier)
        return str(plane.tiers.path(tier, key))


def stage(sessions: sessionmaker, plane: DataPlane, version_id: int) -> str:
    """Bring a version to the hot tier (no-op when there) and mark it used; returns its folder."""
    path = move_version(sessions, plane, version_id, "hot")
    with sessions.begin() as s:
        s.get(DatasetVersion, version_id).last_used_at = utcnow()
    return path


def demote_idle(sessions: sessionmaker, plane: DataPlane, now: datetime | None = None) -> list[str]:
    """Move hot versions unused for ``cold_after_seconds`` (and named by no active job) to cold."""
    now = now or utcnow()
    cutoff = now - timedelta(seconds=plane.cold_after_seconds)
    with sessions() as s:
        idle = [(v.id, v.key) for v in s.scalars(select(DatasetVersion).where(
            DatasetVersion.state == "ready", DatasetVersion.tier == "hot", DatasetVersion.last_used_at < cutoff))]
        busy = {d.get("version_id") for j in s.scalars(select(Job).where(Job.state.in_(ACTIVE_STATES)))
                for d in (j.datasets or [])}
    moved = []
    for version_id, key in idle:
        if version_id in busy:
            continue
        move_version(sessions, plane, version_id, "cold")
        moved.append(key)
    return moved


# -- removal ------------------------------------------------------------------------------

def users_of(session: Session, ds: Dataset, v: DatasetVersion) -> list[str]:
    """What still needs this version: active jobs that named it, and model versions trained on it."""
    ref = f"{ds.name}@{v.version}"
    found = [f"job {j.id} ({j.state})" for j in session.scalars(select(Job).where(Job.state.in_(ACTIVE_STATES)))
             if any(d.get("version_id") == v.id for d in (j.datasets or []))]
    rows = session.execute(select(Model.name, ModelVersion.version, ModelVersion.lineage)
                           .join(ModelVersion,
                                 ModelVersion.model_id == Model.id).where(Model.tenant_id == ds.tenant_id))
    found += [f"model {name}@{number}" for name, number, lineage in rows
              if ref in (lineage or {}).get("datasets", []) or (lineage or {}).get("dataset") == ref]
    return found


def remove_version(sessions: sessionmaker, plane: DataPlane, principal: Principal, ref: str) -> dict:
    """Delete one version: its row, its folder and the objects no other version names.
    Refused while an active job or a registered model version uses it."""
    if parse_ref(ref).version is None:
        raise InvalidRequest(f"name the version to remove: NAME@VERSION (e.g. {parse_ref(ref).name}@1)")
    with sessions.begin() as s:
        ds, v = get_version(s, principal, ref)
        get_dataset(s, principal, ref, write=True)
        users = users_of(s, ds, v)
        if users:
            raise Conflict(f"{ds.name}@{v.version} is in use by {', '.join(users[:5])}"
                           f"{' and more' if len(users) > 5 else ''}: remove those first (models rm), or wait")
        version_id, key, tier, name, number = v.id, v.key, v.tier, ds.name, v.version
        folder = plane.tiers.path(tier, key)
        shas = _manifest_shas(folder)
        s.delete(v)  # the row first: a crash after this leaves only files, which recover() sweeps
    with _lock(version_id):
        shutil.rmtree(folder, ignore_errors=True)
    unused = shas - _referenced(sessions, plane, shas)
    plane.objects.remove(unused)
    log.info("dataset version %s@%d removed (%d objects freed)", name, number, len(unused))
    return {"ref": f"{name}@{number}", "objects_removed": len(unused)}


def _manifest_shas(folder: Path) -> set[str]:
    manifest = folder / "manifest.jsonl"
    if not manifest.is_file():
        return set()
    with open(manifest) as f:
        return {json.loads(line)["sha256"] for line in f if line.strip()}


def token_stats(session: Session, principal: Principal, plane: DataPlane, ref: str, model: ModelVersion, *,
                model_ref: str, models_root: Path, cache_root: Path) -> dict:
    """Token counts of text version ``ref`` for the tokenizer of language model version ``model``
    (resolved, and so visible, by the caller)."""
    ds, v = get_version(session, principal, ref)
    if (v.stats or {}).get("kind") != "text":
        raise InvalidRequest(f"{ds.name}@{v.version} holds images: token counts are for text datasets")
    sig = model.signature or {}
    if sig.get("kind") != "causal-lm":
        raise InvalidRequest(f"{model_ref} is not a language model: name one registered from a Hugging Face folder")
    stats = tokens.count(plane.tiers.path(v.tier, v.key), models_root / model.key, int(sig["context_length"]),
                         cache_root / f"{v.id}-{model.id}.json")
    return {"dataset": f"{ds.name}@{v.version}", "model": model_ref, **stats}


def resolve_for_job(session: Session, principal: Principal, refs: list[str]) -> list[dict]:
    """A job's --dataset references, pinned to versions at submit time."""
    out, keys = [], set()
    for ref in refs:
        ds, v = get_version(session, principal, ref)
        key = dataset_env_key(ds.name)
        if key in keys:
            raise InvalidRequest(f"two datasets called {ds.name!r} in one job: name each once")
        keys.add(key)
        out.append({"ref": f"{ds.name}@{v.version}", "version_id": v.id, "env": key})
    return out
