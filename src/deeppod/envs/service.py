"""Jobs' environments as the control plane sees them on its node: listed per tenant with their
size and users, removed, and evicted least recently used first when the cache is over its cap
(never one that an active job uses, never one being built). Unpacked container images
(envs/images.py) are in the same cache: shared by every tenant, removed by an admin."""

from __future__ import annotations

import fcntl
import json
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from deeppod.auth.service import Principal, require_admin
from deeppod.contract import ACTIVE_STATES
from deeppod.envs import images
from deeppod.envs.build import ready_file, used_file
from deeppod.errors import Conflict, NotFound
from deeppod.nofollow import tree_bytes
from deeppod.store.models import Job, Tenant

log = logging.getLogger(__name__)
STALE_BUILD_S = 600.0  # a staging folder whose lock nobody holds, this old: a build that died


@dataclass(frozen=True)
class EnvInfo:
    key: str
    tenant: str
    requirements: list[str]
    python: str | None
    bytes: int
    built_at: float
    last_used: float
    active_jobs: list[int] = field(metadata={"description": "active jobs that use it: it is not removed while there "
                                                           "are any"})
    path: str  # on the node: never shown back (EnvOut leaves it out)
    image: str | None = field(default=None, metadata={"description": "an unpacked container image's name (shared by "
                                                                      "every tenant)"})


SHARED = "(shared)"  # what an image's tenant is shown as


@dataclass(frozen=True)
class ImageInfo:
    name: str
    archive_bytes: int
    key: str  # what it unpacks as (the cache entry's key while the archive is unchanged)
    unpacked: bool


def _found(root: Path, tenant_ids: list[int], names: dict[int, str], using: dict[str, list[int]], *,
           images: bool = True) -> list[EnvInfo]:
    """The ready environments of these tenants (and the unpacked images), from root's own
    marks beside each (never from inside one: its files are the tenant's), newest use first."""
    out = []
    groups = [(root / str(tid), names.get(tid, str(tid))) for tid in tenant_ids]
    for folder, tenant in [*groups, *([(root / "images", SHARED)] if images else [])]:
        for ready in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            env = ready.with_suffix("")
            try:
                doc = json.loads(ready.read_text())
            except (OSError, ValueError):
                continue
            if not env.is_dir() or env.is_symlink():
                continue
            size = doc.get("bytes")  # measured when it was built
            out.append(EnvInfo(env.name, tenant, list(doc.get("requirements", [])),
                               doc.get("python"), int(size) if size is not None else tree_bytes(env),
                               float(doc.get("built_at", 0.0)), _used(env, doc), using.get(env.name, []), str(env),
                               doc.get("image")))
    return sorted(out, key=lambda e: -e.last_used)


def _active(session: Session) -> dict[str, list[int]]:
    using: dict[str, list[int]] = {}
    for job_id, key in session.execute(select(Job.id, Job.env_key).where(
            Job.env_key.is_not(None), Job.state.in_([s.value for s in ACTIVE_STATES]))):
        using.setdefault(key, []).append(job_id)
    return using


def _used(path: Path, doc: dict) -> float:
    try:
        return used_file(path).stat().st_mtime
    except OSError:
        return float(doc.get("built_at", 0.0))


def list_envs(session: Session, principal: Principal, root: Path) -> list[EnvInfo]:
    """The environments of the caller's tenant (an admin: every tenant's), newest use first."""
    names = dict(session.execute(select(Tenant.id, Tenant.name)).all())
    return _found(root, list(names) if principal.is_admin else [principal.tenant_id], names, _active(session))


def remove(session: Session, principal: Principal, root: Path, key: str) -> EnvInfo:
    """Remove one environment (its tenant's members or an admin); refused while an active job uses it."""
    found = [e for e in list_envs(session, principal, root) if e.key == key]
    if not found:
        raise NotFound(f"no environment {key!r} of your tenant on this server: 'deeppod envs ls' lists them")
    env = found[0]
    if env.image is not None:
        require_admin(principal, f"remove the unpacked image {env.image} (every tenant's jobs use it)")
    if env.active_jobs:
        raise Conflict(f"environment {key} is used by active job(s) {', '.join(map(str, env.active_jobs))}; remove "
                       "it once they end")
    if not _drop(Path(env.path)):
        raise Conflict(f"environment {key} is being built or used right now; try again in a moment")
    return env


def _drop(path: Path) -> bool:
    """Remove an environment unless its lock is held (a build, or a job finding it, under way)."""
    with open(path.parent / f"{path.name}.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        try:
            ready_file(path).unlink(missing_ok=True)  # never used from here on, even if the removal is cut short
            used_file(path).unlink(missing_ok=True)
            shutil.rmtree(path, ignore_errors=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return True


def prune(session: Session, root: Path, cap_bytes: int, principal: Principal | None = None) -> list[str]:
    """Least recently used first, remove environments until they take at most ``cap_bytes``
    (0: every one not in use), and builds that died; the keys removed. ``principal``: an
    administrator asking (the housekeeping round passes none)."""
    if principal is not None:
        require_admin(principal, "prune the environment cache")
    _sweep_staging(root)
    using = _active(session)
    envs = [(e.last_used, Path(e.path), e.bytes) for e in _found(root, _tenant_ids(root), {}, using)]
    total = sum(size for _, _, size in envs)
    gone = []
    for _, path, size in sorted(envs, key=lambda e: e[0]):
        if total <= cap_bytes:
            break
        if path.name in using or not _drop(path):
            continue
        total -= size
        gone.append(path.name)
        log.info("removed environment %s (%d MB): the cache was over its cap", path.name, size >> 20)
    return gone


def _tenant_ids(root: Path) -> list[int]:
    return [int(p.name) for p in root.iterdir() if p.name.isdigit()] if root.is_dir() else []


def tenant_bytes(root: Path) -> dict[int, int]:
    """Tenant id -> what its environments take (as measured when each was built): counted
    against its plan's storage quota (jobs/quotas.py). Unpacked images are nobody's."""
    out: dict[int, int] = {}
    for tid in _tenant_ids(root):
        out[tid] = sum(e.bytes for e in _found(root, [tid], {}, {}, images=False))
    return out


def _sweep_staging(root: Path) -> None:
    """Staging and work folders of builds that died (a server killed mid-build): old, and their
    key's lock free."""
    now = time.time()
    for leftover in [*root.glob("*/.staging-*"), *root.glob("*/.build-*")] if root.is_dir() else []:
        key = leftover.name.split("-")[1]
        try:
            if now - leftover.stat().st_mtime < STALE_BUILD_S:
                continue
        except OSError:
            continue
        with open(leftover.parent / f"{key}.lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # its build is alive
                continue
            shutil.rmtree(leftover, ignore_errors=True)
            fcntl.flock(lock, fcntl.LOCK_UN)


def list_images(root: Path, image_dir: str | None) -> list[ImageInfo]:
    """The container images this server offers (DEEPPOD_IMAGE_DIR) and whether each is unpacked here."""
    out = []
    for name, archive in images.offered(image_dir).items():
        try:
            key = images.key(archive)
            size = archive.stat().st_size
        except OSError:
            continue
        unpacked = images.ready_file(root / "images" / key).is_file()
        out.append(ImageInfo(name, size, key, unpacked))
    return out
