"""What the S3 endpoint shows a caller, and where each object's bytes are (docs/datasets.md,
"S3"). Five buckets, the same names for every tenant, each showing that tenant's own:

- ``datasets``: every ready version of the tenant's datasets, read-only: ``NAME/vN/PATH`` is
  the image the manifest lists at PATH (the file in the content-addressed store that
  training reads too: nothing is copied), ``NAME/vN/.manifest.jsonl`` and
  ``NAME/vN/.stats.json`` describe the version.
- ``shared``: other tenants' shared datasets, read-only: ``TENANT/NAME/vN/...``, as above.
- ``inbox``: where writers put files for a dataset's next version: ``NAME/PATH``. PUT, GET,
  LIST, DELETE; ``deeppod data commit NAME`` (or a PUT of ``NAME/.commit``) ingests them. A
  key ending in ``/`` is a folder marker (what Hadoop's S3A and the AWS console write for a
  "mkdir"): a hidden ``.folder`` file in that folder. An object whose key is also a folder of
  other keys (``a/b`` beside ``a/b/c``) is the hidden file ``a/b/.object``. Ingest skips both.
- ``models``: the tenant's model versions' artifacts, read-only: ``NAME/vN/FILE``.
- ``jobs``: the tenant's jobs' outputs, read-only: ``ID/model/...`` and ``ID/outputs/...``.
  A job wrote them, so they are read as root reads what a job may change (deeppod.nofollow):
  folders opened without following a link, only regular files served.

Another tenant's datasets, inboxes and models are not there at all: a key of theirs is a
missing key. A key is UTF-8 text without control characters (:func:`request_key`: a key is
a file's name here, and two byte strings must not decode to one name), and it is checked
segment by segment (no ``..``, no empty segment, no leading ``.`` in an inbox except
``.commit``) before any path is built from them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote_to_bytes

from sqlalchemy import select
from sqlalchemy.orm import Session

from deeppod.atomic import atomic_write
from deeppod.auth import scope
from deeppod.datasets.archive import CONTROL_CHARACTERS
from deeppod.datasets.service import DataPlane
from deeppod.errors import S3Error
from deeppod.store.models import Dataset, DatasetVersion, Job, Model, ModelVersion, Tenant

log = logging.getLogger(__name__)

BUCKETS = ("datasets", "inbox", "jobs", "models", "shared")
READ_ONLY = ("datasets", "jobs", "models", "shared")
JOB_FOLDERS = ("model", "outputs")  # what of a job's folder its tenant reads through S3
COMMIT = ".commit"
MANIFEST, STATS = ".manifest.jsonl", ".stats.json"
ETAG_SUFFIX = ".etag"  # beside an inbox file where xattrs are not kept: its MD5 (".NAME.etag")
FOLDER = ".folder"  # an inbox folder's marker object (key "NAME/DIR/"): hidden, so never ingested
OBJECT = ".object"  # the object "NAME/DIR" where DIR is also a folder of keys ("NAME/DIR/FILE")


@dataclass(frozen=True, slots=True)
class Entry:
    """One object: its key in the bucket, size, modification time, ETag, and file."""

    key: str
    size: int
    mtime: float
    etag: str | None  # None: read (an inbox file's sidecar) or computed from the file when asked
    path: Path | str  # a str where a listing makes 100,000 of them (a Path costs 15 us to build)
    sidecar: bool = False  # an inbox file: its ETag was written beside it at upload
    guarded: bool = False  # in a job's folder: opened only through deeppod.nofollow (open_object)

    def with_stat(self, size: int, mtime: float) -> Entry:
        """This entry with its size and time (dataclasses.replace without its cost per call)."""
        return Entry(self.key, size, mtime, self.etag, self.path, self.sidecar, self.guarded)


def open_object(e: Entry):
    """The entry's file for reading. One a job could change is opened with no link followed
    and checked to be a regular file on the descriptor that is read."""
    if not e.guarded:
        return open(e.path, "rb")
    from deeppod.nofollow import open_dir, open_regular

    try:
        folder = open_dir(e.path.parent)
        try:
            fd, _ = open_regular(folder, e.path.name)
        finally:
            os.close(folder)
    except OSError as exc:  # the job swapped it for a link, a folder, a pipe, or took it away: not an object
        log.info("S3: %s is not served: %s", e.key[:300], exc.strerror or exc)  # one line, no traceback
        raise S3Error("NoSuchKey", f"the specified key does not exist: {e.key[:300]} (the job's file is not a "
                                   "regular file now)") from None
    return os.fdopen(fd, "rb")


def completed(e: Entry) -> Entry | None:
    """An entry listed without its size and time, with them; None if the file went meanwhile."""
    if e.size >= 0:
        return e
    st = _regular(e.path)
    return None if st is None else e.with_stat(st.st_size, st.st_mtime)


def etag_of(e: Entry) -> str | None:
    """The entry's ETag if known without hashing the file (its own, or its sidecar's)."""
    return e.etag or (read_etag(e.path) if e.sidecar else None)


def request_key(sent: str) -> str:
    """A key as a request sent it (percent-encoded; ASGI hands the bytes over as latin-1), as
    text: UTF-8 without control characters, else S3's InvalidURI (400)."""
    try:
        key = unquote_to_bytes(sent.encode("latin-1")).decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        raise S3Error("InvalidURI", "Couldn't parse the specified URI: the key is not UTF-8 once its %-escapes are "
                      "decoded; send the key's UTF-8 bytes, percent-encoded") from None
    if m := CONTROL_CHARACTERS.search(key):
        raise S3Error("InvalidURI", f"Couldn't parse the specified URI: the key {key[:200]!r} holds the control "
                      f"character U+{ord(m.group()):04X}; keys here are file names: rename it without control "
                      "characters")
    return key


def segments(key: str, *, inbox: bool = False) -> list[str]:
    """The key's parts, refused where a path could escape or hide (InvalidArgument)."""
    parts = key.split("/")
    if (not key or any(p in ("", ".", "..") for p in parts) or CONTROL_CHARACTERS.search(key)
            or len(key.encode()) > 1024):
        raise S3Error("InvalidArgument", f"the key {key[:200]!r} is not a plain relative path (no empty, '.' or "
                      "'..' segments, no control characters, at most 1024 bytes)")
    if inbox and any(p.startswith(".") for p in parts) and not (len(parts) == 2 and parts[1] == COMMIT):
        raise S3Error("InvalidArgument", f"the key {key[:200]!r} has a segment that starts with '.': an inbox holds "
                      "files for a dataset (NAME/CLASS/FILE), and NAME/.commit to ingest them")
    return parts


def inbox_path(root: Path, key: str) -> Path:
    """Where an inbox key's object is: its file; for a folder marker (``a/b/``) the hidden
    marker file in that folder; for a key that is a folder of other keys too, the hidden
    ``.object`` in it. The key is checked first (InvalidArgument)."""
    if key.endswith("/"):
        return root.joinpath(*segments(key[:-1], inbox=True), FOLDER)
    path = root.joinpath(*segments(key, inbox=True))
    return path / OBJECT if path.is_dir() and not path.is_symlink() else path


def file_md5(e: Entry) -> str:
    h = hashlib.md5()
    with open_object(e) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Namespace:
    """The buckets of one server: a caller's view of them, built from the database and files."""

    def __init__(self, plane: DataPlane, models_dir: Path, jobs_dir: Path | None = None):
        self.plane, self.models_dir, self.jobs_dir = plane, models_dir, jobs_dir

    @property
    def root(self) -> Path:
        return self.plane.tiers.hot / ".s3"

    def inbox_root(self, tenant_id: int) -> Path:
        return self.root / str(tenant_id) / "inbox"

    def uploads_root(self, tenant_id: int) -> Path:
        return self.root / str(tenant_id) / "uploads"

    # -- reading ---------------------------------------------------------------------------
    def entries(self, session: Session, tenant_id: int, bucket: str, prefix: str) -> Iterator[Entry]:
        """Every object of ``bucket`` whose key starts with ``prefix`` (in no order). Only the
        datasets, versions and models the prefix can match are read."""
        if bucket == "inbox":
            yield from self._inbox(tenant_id, prefix)
        elif bucket == "models":
            yield from self._models(session, tenant_id, prefix)
        elif bucket == "jobs":
            yield from self._jobs(session, tenant_id, prefix)
        else:
            yield from self._datasets(session, tenant_id, prefix, shared=bucket == "shared")

    def find(self, session: Session, tenant_id: int, bucket: str, key: str) -> Entry:
        if bucket == "inbox":
            path = inbox_path(self.inbox_root(tenant_id), key)
            st = _regular(path)
            if st is None or (path.name.startswith(".") and path.name not in (FOLDER, OBJECT)):  # NAME/.commit
                raise _no_key(key)
            return Entry(key, st.st_size, st.st_mtime, None, path, sidecar=True)
        if key.endswith("/"):  # no folder objects in the read-only buckets
            segments(key[:-1])
            raise _no_key(key)
        segments(key)
        for e in self.entries(session, tenant_id, bucket, key):
            if e.key == key:
                return e
        raise _no_key(key)

    def _inbox(self, tenant_id: int, prefix: str) -> Iterator[Entry]:
        root = self.inbox_root(tenant_id)
        first = prefix.split("/", 1)[0] if "/" in prefix else ""
        start = root / first if first and first not in (".", "..") else root
        if not start.is_dir():
            return
        base = len(str(root)) + 1
        stack = [str(start)]
        while stack:  # scandir: one stat per file, none per folder's listing
            try:
                listing = list(os.scandir(stack.pop()))
            except OSError:
                continue
            for entry in listing:
                if entry.name in (FOLDER, OBJECT) and entry.is_file(follow_symlinks=False):
                    # "a/b/": its folder's marker; "a/b": the object the folder shares its name with
                    key = entry.path[base:-len(entry.name) - (entry.name == OBJECT)].replace(os.sep, "/")
                    if key.startswith(prefix):
                        yield Entry(key, -1, 0.0, None, entry.path, sidecar=True)
                if entry.name.startswith("."):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    key = entry.path[base:].replace(os.sep, "/")
                    if key.startswith(prefix):  # size and time: stat()ed for the page shown only (completed())
                        yield Entry(key, -1, 0.0, None, entry.path, sidecar=True)

    def _models(self, session: Session, tenant_id: int, prefix: str) -> Iterator[Entry]:
        name = prefix.split("/", 1)[0] if "/" in prefix else None
        q = scope.of_tenant(select(Model, ModelVersion).join(ModelVersion, ModelVersion.model_id == Model.id),
                            Model, tenant_id)
        if name:
            q = q.where(Model.name == name)
        for model, version in session.execute(q).all():
            base = f"{model.name}/v{version.version}/"
            if not (base.startswith(prefix) or prefix.startswith(base)):
                continue
            folder = self.models_dir / version.key
            for path in sorted(folder.rglob("*")) if folder.is_dir() else ():
                st = _regular(path)
                key = base + path.relative_to(folder).as_posix()
                if st is not None and key.startswith(prefix):
                    yield Entry(key, st.st_size, st.st_mtime, None, path)

    def _jobs(self, session: Session, tenant_id: int, prefix: str) -> Iterator[Entry]:
        if self.jobs_dir is None:
            return
        first = prefix.split("/", 1)[0] if "/" in prefix else ""
        q = scope.of_tenant(select(Job.id), Job, tenant_id)
        if first:
            if not first.isdigit():
                return
            q = q.where(Job.id == int(first))
        for job_id in session.scalars(q):
            for sub in JOB_FOLDERS:
                base = f"{job_id}/{sub}/"
                if base.startswith(prefix) or prefix.startswith(base):
                    yield from _walk_guarded(self.jobs_dir / str(job_id) / sub, base, prefix)

    def _datasets(self, session: Session, tenant_id: int, prefix: str, *, shared: bool) -> Iterator[Entry]:
        q = select(Dataset, DatasetVersion, Tenant).join(DatasetVersion, DatasetVersion.dataset_id == Dataset.id) \
            .join(Tenant, Dataset.tenant_id == Tenant.id).where(DatasetVersion.state == "ready")
        q = q.where(Dataset.tenant_id != tenant_id, Dataset.shared.is_(True)) if shared else \
            scope.of_tenant(q, Dataset, tenant_id)
        for ds, v, tenant in session.execute(q).all():
            base = (f"{tenant.name}/" if shared else "") + f"{ds.name}/v{v.version}/"
            if not (base.startswith(prefix) or prefix.startswith(base)):
                continue
            yield from self._version(v, base, prefix)

    def _version(self, v: DatasetVersion, base: str, prefix: str) -> Iterator[Entry]:
        folder = self.plane.tiers.path(v.tier, v.key)
        manifest = folder / "manifest.jsonl"
        st = _regular(manifest)
        if st is None:
            return
        if (base + MANIFEST).startswith(prefix):
            yield Entry(base + MANIFEST, st.st_size, st.st_mtime, None, manifest)
        if (base + STATS).startswith(prefix):
            stats = self.root / "stats" / f"{v.id}.json"
            if not stats.is_file():  # written once: the version never changes
                stats.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(stats, json.dumps(v.stats or {}, indent=1, sort_keys=True), mode=0o644)
            sst = stats.stat()
            yield Entry(base + STATS, sst.st_size, st.st_mtime, None, stats)
        objects = self.plane.objects
        # a prefix inside the version (a GET names one file): only the lines that can match are
        # parsed, found by the path's text as ingest wrote it ('"path": "cats/001.png"')
        needle = '"path": ' + json.dumps(prefix[len(base):])[:-1] if len(prefix) > len(base) else ""
        with open(manifest) as f:
            for line in f:
                if needle and needle not in line:
                    continue
                row = json.loads(line)
                key = base + row["path"]
                if key.startswith(prefix):
                    yield Entry(key, int(row["bytes"]), st.st_mtime, row.get("md5"), objects.path(row["sha256"]))


def _walk_guarded(folder: Path, base: str, prefix: str) -> Iterator[Entry]:
    """The regular files under a job-writable ``folder``, walked through descriptors (no link
    followed, none listed)."""
    from deeppod.nofollow import open_dir

    try:
        top = open_dir(folder)
    except OSError:
        return
    try:
        for dirpath, _dirs, files, dir_fd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
            for name in files:
                try:
                    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                except OSError:
                    continue
                rel = os.path.normpath(os.path.join(dirpath, name)).replace(os.sep, "/")
                key = base + rel
                if stat.S_ISREG(st.st_mode) and key.startswith(prefix):
                    yield Entry(key, st.st_size, st.st_mtime, None, folder / rel, guarded=True)
    finally:
        os.close(top)


def _regular(path: Path | str):
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def etag_path(path: Path) -> Path:
    return path.with_name("." + path.name + ETAG_SUFFIX)


XATTR = "user.deeppod.etag"  # an inbox file's ETag, on the file itself where the file system keeps them


def write_etag(path: Path, etag: str, dest: Path) -> None:
    """Keep ``etag`` with the file ``path`` that is about to become ``dest``: in an extended
    attribute (a listing reads 1,000 of them in about 3 ms), or where the file system keeps
    none, in a hidden file beside ``dest``."""
    try:
        os.setxattr(path, XATTR, etag.encode())
        etag_path(dest).unlink(missing_ok=True)
    except OSError:
        etag_path(dest).write_text(etag)


def etags_in(header: str) -> set[str]:
    """The quoted ETags an If-Match or If-None-Match header lists."""
    return {('"' + v.strip().strip('"') + '"') for v in header.split(",")}


def read_etag(path: Path | str) -> str | None:
    try:
        return os.getxattr(path, XATTR, follow_symlinks=False).decode() or None
    except OSError:
        pass
    try:
        return etag_path(Path(path)).read_text().strip() or None
    except OSError:
        return None


def _no_key(key: str) -> S3Error:
    return S3Error("NoSuchKey", f"the specified key does not exist: {key[:300]}")
