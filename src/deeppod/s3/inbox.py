"""A tenant's inboxes: files written through S3 wait there (``.s3/TENANT/inbox/NAME/...`` in
the hot tier) until a commit turns them into the dataset's next immutable version, through
the same ingest as an upload (policy, quarantine with reasons, deduplication, lineage "via
s3"). An upload is written beside its place and renamed into it when complete and checked,
so a failed, cut or refused upload leaves nothing; multipart parts wait in ``uploads/``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import sessionmaker

from deeppod.atomic import atomic_write, move_into_place
from deeppod.auth.service import Principal, check_name
from deeppod.datasets import service as datasets
from deeppod.errors import InvalidRequest, NotFound, S3Error
from deeppod.s3 import metadata, multipart_checksums
from deeppod.s3.namespace import (
    COMMIT,
    OBJECT,
    Namespace,
    etag_path,
    etags_in,
    inbox_path,
    read_etag,
    segments,
    write_etag,
)

log = logging.getLogger(__name__)
MAX_OBJECT = 5 << 30  # S3's largest single PUT, and its largest part
MIN_PART = 5 << 20  # every part but the last (S3's)
MAX_PARTS = 10_000
ABANDONED_AFTER = 7 * 86400  # a multipart upload untouched this long is removed at start
_commits = threading.Lock()
# an inbox write's place, its condition and its rename, against this server's other writes (a
# key under it arriving meanwhile would make a folder of its place; a condition must stay true)
_placing = threading.Lock()


def dataset_of(key: str) -> str:
    name = segments(key[:-1] if key.endswith("/") else key, inbox=True)[0]
    try:
        return check_name("dataset", name)
    except InvalidRequest as exc:
        raise S3Error("InvalidArgument", f"an inbox key starts with the dataset's name: {exc}") from None


def temp_file(ns: Namespace, tenant_id: int) -> Path:
    path = temp_path(ns, tenant_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def temp_path(ns: Namespace, tenant_id: int) -> Path:
    """A new temporary file's name; its folder may not be there yet (no file system call)."""
    return ns.root / str(tenant_id) / "tmp" / uuid.uuid4().hex


def place(ns: Namespace, tenant_id: int, key: str, tmp: Path, etag: str, meta: dict | None = None,
          condition: Condition | None = None) -> None:
    """A complete, checked upload into its place, with its metadata, under its If-(None-)Match."""
    _place(ns, tenant_id, key, tmp, etag, meta or {}, condition)


@dataclass(frozen=True)
class Condition:
    """A conditional write: ``if_match`` (the ETags the object must have now, or "*") and
    ``if_none_match`` ("*": only if there is no such object yet)."""

    if_match: str | None = None
    if_none_match: str | None = None

    @classmethod
    def of(cls, headers) -> Condition | None:
        if "if-match" in headers or "if-none-match" in headers:
            return cls(headers.get("if-match"), headers.get("if-none-match"))
        return None

    def check(self, dest: Path, key: str) -> None:
        exists = dest.is_file()
        etag = f'"{read_etag(dest)}"' if exists else None
        if self.if_none_match is not None and exists:
            if self.if_none_match.strip() == "*" or etag in etags_in(self.if_none_match):
                raise S3Error("PreconditionFailed", f"{key} exists (If-None-Match): it was not replaced")
        if self.if_match is not None:
            if not exists:
                raise S3Error("NoSuchKey", f"the specified key does not exist: {key[:300]} (If-Match)")
            if self.if_match.strip() != "*" and etag not in etags_in(self.if_match):
                raise S3Error("PreconditionFailed", f"{key} has another ETag now (If-Match): it was not replaced")


def _place(ns: Namespace, tenant_id: int, key: str, tmp: Path, etag: str, meta: dict,
           condition: Condition | None) -> None:
    dataset_of(key)
    root = ns.inbox_root(tenant_id)
    with _placing:
        dest = inbox_path(root, key)
        _make_folders(root, dest.parent)
        if condition is not None:
            try:
                condition.check(dest, key)
            except S3Error:
                tmp.unlink(missing_ok=True)
                raise
        write_etag(tmp, etag, dest)  # before it is in place: a listing never sees it without
        metadata.write(tmp, meta, dest)
        move_into_place(tmp, dest)


def _make_folders(root: Path, folder: Path) -> None:
    """``folder`` and those above it; an object where one must be ("a/b" for the key "a/b/c")
    moves into it as its ``.object``, with what is kept beside it, and keeps its key."""
    if os.path.isdir(folder):  # the usual case (a folder has no object above it): one stat
        return
    above = root
    for part in folder.relative_to(root).parts:
        above = above / part
        if above.is_file() and not above.is_symlink():
            moving = above.with_name(f".{above.name}.{uuid.uuid4().hex}.moving")
            os.rename(above, moving)
            above.mkdir()
            os.rename(moving, above / OBJECT)
            for beside, into in ((etag_path(above), etag_path(above / OBJECT)),
                                 (metadata.sidecar(above), metadata.sidecar(above / OBJECT))):
                if beside.exists():
                    os.rename(beside, into)
    folder.mkdir(parents=True, exist_ok=True)


def delete(ns: Namespace, tenant_id: int, key: str) -> None:
    """S3 answers a delete of a missing key with success too."""
    dest = inbox_path(ns.inbox_root(tenant_id), key)
    if dest.is_file() and not dest.is_symlink():
        dest.unlink()
        etag_path(dest).unlink(missing_ok=True)
        metadata.sidecar(dest).unlink(missing_ok=True)
        _prune(dest.parent, ns.inbox_root(tenant_id))


def delete_many(ns: Namespace, tenant_id: int, keys: list[str]) -> tuple[list[str], list[tuple[str, str, str]]]:
    """DeleteObjects: the keys deleted, and (key, code, message) for each refused."""
    done, failed = [], []
    for k in keys:
        try:
            delete(ns, tenant_id, k)
            done.append(k)
        except S3Error as exc:
            failed.append((k, exc.code, exc.message))
    return done, failed


def _prune(folder: Path, root: Path) -> None:
    while folder != root and folder.is_dir():
        try:
            folder.rmdir()  # only when empty
        except OSError:
            return
        folder = folder.parent


# -- multipart -----------------------------------------------------------------------------

def create_upload(ns: Namespace, tenant_id: int, key: str, meta: dict | None = None) -> str:
    dataset_of(key)
    upload_id = uuid.uuid4().hex
    folder = ns.uploads_root(tenant_id) / upload_id
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps(meta or {}))
    (folder / "key").write_text(key)  # last: the upload exists once its key is written
    return upload_id


def upload_folder(ns: Namespace, tenant_id: int, upload_id: str, key: str) -> Path:
    folder = ns.uploads_root(tenant_id) / upload_id
    if len(upload_id) != 32 or not upload_id.isalnum() or not (folder / "key").is_file() or \
            (folder / "key").read_text() != key:
        raise S3Error("NoSuchUpload", "the specified multipart upload does not exist: it was completed or aborted, "
                      "or its id or key is wrong")
    return folder


def completed(ns: Namespace, tenant_id: int, upload_id: str, key: str) -> tuple[str, dict] | None:
    """The ETag and checksums an upload of ``key`` completed with, if it did lately (kept a week): S3 answers
    a repeated CompleteMultipartUpload with success, so a client whose first answer was lost
    on the way can retry it."""
    if len(upload_id) != 32 or not upload_id.isalnum():
        return None
    try:
        done = json.loads((ns.uploads_root(tenant_id) / f"{upload_id}.done").read_text())
    except (OSError, ValueError):
        return None
    return (done["etag"], done.get("checksums") or {}) if done.get("key") == key and done.get("etag") else None


def part_number(raw: str) -> int:
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_PARTS:
        raise S3Error("InvalidArgument", f"partNumber must be between 1 and {MAX_PARTS}")
    return int(raw)


def put_part(folder: Path, number: int, tmp: Path, etag: str, checksums: dict | None = None) -> None:
    """A part into its place, with its ETag and the checksums its PUT checked (a part sent again
    replaces both)."""
    (folder / f"{number:05d}.etag").write_text(etag)
    (folder / f"{number:05d}.sum").write_text(json.dumps(checksums or {}))
    move_into_place(tmp, folder / f"{number:05d}")


def parts(folder: Path) -> list[tuple[int, int, str, float]]:
    """(number, size, etag, mtime) of the parts uploaded so far."""
    out = []
    for p in sorted(folder.glob("[0-9][0-9][0-9][0-9][0-9]")):
        st = p.stat()
        out.append((int(p.name), st.st_size, (folder / f"{p.name}.etag").read_text(), st.st_mtime))
    return out


def complete(ns: Namespace, tenant_id: int, folder: Path, key: str, asked: list[tuple[int, str, dict]],
             condition: Condition | None = None, headers=None) -> tuple[str, dict]:
    """Join the parts the client lists, in its order, into the object. Returns its ETag (S3's:
    the MD5 of the parts' MD5s, then "-N") and the checksum headers it keeps (an upload started
    with x-amz-checksum-algorithm: multipart_checksums)."""
    have = {n: (size, etag) for n, size, etag, _ in parts(folder)}
    _check_listed(asked, have)
    meta = _upload_meta(folder)
    spec = meta.pop(CHECKSUM_SPEC, None) or {}
    sums = []
    for n, _, listed in asked if spec else ():
        stored = part_checksums(folder, n).get(multipart_checksums.header(spec))
        multipart_checksums.check_listed(spec, n, listed, stored)
        sums.append(stored)
    tmp, etag, whole = _join(ns, tenant_id, folder, [(n, e) for n, e, _ in asked], multipart_checksums.whole_crc(spec))
    checksums = {}
    if spec:
        value = multipart_checksums.combine(spec, sums, whole)
        try:
            multipart_checksums.check_expected(spec, headers or {}, value)
        except S3Error:
            tmp.unlink(missing_ok=True)
            raise
        checksums = {multipart_checksums.header(spec): value, "x-amz-checksum-type": spec["type"]}
        meta[metadata.CHECKSUMS] = checksums
        meta[metadata.PART_CHECKSUMS] = sums
    meta[metadata.PARTS] = [have[n][0] for n, _, _ in asked]
    place(ns, tenant_id, key, tmp, etag, meta, condition)
    atomic_write(folder.with_name(f"{folder.name}.done"),
                 json.dumps({"key": key, "etag": etag, "checksums": checksums}).encode())
    shutil.rmtree(folder, ignore_errors=True)
    return etag, checksums


CHECKSUM_SPEC = "checksum"  # in an upload's meta.json: {"algorithm", "type"} asked for at its start


def _check_listed(asked: list[tuple[int, str, dict]], have: dict) -> None:
    if not asked:
        raise S3Error("MalformedXML", "CompleteMultipartUpload lists no parts")
    if [n for n, _, _ in asked] != sorted({n for n, _, _ in asked}):
        raise S3Error("InvalidPartOrder", "the parts must be listed in ascending order, each once")
    for i, (n, etag, _) in enumerate(asked):
        if n not in have or have[n][1] != etag.strip('"'):
            raise S3Error("InvalidPart", f"part {n} was not uploaded or its ETag differs: list the parts you "
                          "uploaded (ListParts) and complete with those")
        if i < len(asked) - 1 and have[n][0] < MIN_PART:
            raise S3Error("EntityTooSmall", f"part {n} is {have[n][0]} bytes: every part but the last must be at "
                          "least 5 MiB")


def _join(ns: Namespace, tenant_id: int, folder: Path, asked: list[tuple[int, str]],
          whole_crc: str | None) -> tuple[Path, str, int]:
    """The parts, in order, into a new file: (file, ETag, the ``whole_crc`` of every byte, or 0)."""
    import hashlib

    from deeppod.s3 import crc

    tmp = temp_file(ns, tenant_id)
    joined, whole = hashlib.md5(), 0
    with open(tmp, "wb") as out:
        for n, etag in asked:
            with open(folder / f"{n:05d}", "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    if whole_crc:
                        whole = crc.update(whole_crc, block, whole)
                    out.write(block)
            joined.update(bytes.fromhex(etag.strip('"')))
    return tmp, f"{joined.hexdigest()}-{len(asked)}", whole


def _upload_meta(folder: Path) -> dict:
    try:
        return json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError):
        return {}


def upload_checksum(folder: Path) -> dict:
    """The checksum an upload was started with ({"algorithm", "type"}), or {}."""
    return _upload_meta(folder).get(CHECKSUM_SPEC) or {}


def part_checksums(folder: Path, number: int) -> dict:
    """The checksums part ``number``'s PUT checked ({"x-amz-checksum-sha256": ...})."""
    try:
        return json.loads((folder / f"{number:05d}.sum").read_text())
    except (OSError, ValueError):
        return {}


def abort(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


# -- commit --------------------------------------------------------------------------------

def commit(sessions: sessionmaker, ns: Namespace, principal: Principal, name: str, *, via: str) -> int:
    """The inbox of ``name`` into the dataset's next version; its id. The files are taken
    aside first, so uploads that arrive meanwhile wait for the next commit; what the ingest
    refuses is put back, so nothing is lost."""
    check_name("dataset", name)
    inbox = ns.inbox_root(principal.tenant_id) / name
    with _commits:
        (inbox / COMMIT).unlink(missing_ok=True)
        etag_path(inbox / COMMIT).unlink(missing_ok=True)
        if not inbox.is_dir() or not any(inbox.iterdir()):
            raise NotFound(f"the inbox of {name!r} is empty: put files in it first (s3://inbox/{name}/CLASS/FILE)")
        taken = ns.root / str(principal.tenant_id) / f"committing-{uuid.uuid4().hex}"
        os.rename(inbox, taken)
        (taken / ".name").write_text(name)  # for recover(): whose files to put back after a crash
    try:
        return datasets.ingest_upload(sessions, ns.plane, principal, name, taken, source="s3",
                                      lineage={"via": via})
    except BaseException:
        _put_back(taken, inbox)
        raise
    finally:
        shutil.rmtree(taken, ignore_errors=True)


def _put_back(taken: Path, inbox: Path) -> None:
    """An ingest that failed: its files return to the inbox (newer uploads of a key win)."""
    for folder, _dirs, files in os.walk(taken):
        for name in files:
            if folder == str(taken) and name == ".name":
                continue
            src = Path(folder) / name
            dest = inbox / src.relative_to(taken)
            if not dest.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                move_into_place(src, dest)


def recover(ns: Namespace, now: float) -> None:
    """At start: temporary files of cut uploads go; a commit a crash interrupted puts its files
    back (its version, if any, was undone by the datasets' own recovery); multipart uploads
    untouched for a week go (younger ones can still be completed)."""
    if not ns.root.is_dir():
        return
    for tenant in ns.root.iterdir():
        if not tenant.name.isdigit():
            continue
        shutil.rmtree(tenant / "tmp", ignore_errors=True)
        for taken in tenant.glob("committing-*"):
            name = (taken / ".name").read_text().strip() if (taken / ".name").is_file() else ""
            if name:
                log.warning("putting back the files of an interrupted commit of %s", name)
                _put_back(taken, tenant / "inbox" / name)
            shutil.rmtree(taken, ignore_errors=True)
        for upload in (tenant / "uploads").glob("*") if (tenant / "uploads").is_dir() else ():
            if now - upload.stat().st_mtime > ABANDONED_AFTER:  # an upload, or a completed one's record
                if upload.is_dir():
                    shutil.rmtree(upload, ignore_errors=True)
                else:
                    upload.unlink(missing_ok=True)
