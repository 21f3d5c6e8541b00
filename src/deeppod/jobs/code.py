"""A job's code sent from the submitter's machine (``deeppod submit`` outside the server's
folders, a CLI on a laptop): a tar.gz archive per tenant named by its SHA-256, unpacked into
each job's own folder, which is then the job's working directory.

Archives are a cache: a job unpacks its copy when it is submitted, so an archive may go at any
time. Each tenant keeps at most ``tenant_bytes`` of them, least recently used first out, so
one tenant's uploads never fill the disk under another's jobs. Sending the same code again
(a retry, every trial of a search) costs one request and no copy.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from deeppod.atomic import atomic_file
from deeppod.errors import InvalidRequest, NotFound, TooLarge

DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
MAX_FILES = 50_000
CODE_KEEP_S = 7 * 86400.0  # archives unused this long are dropped
UNPACKED_RATIO = 4  # an archive may unpack to this many times its limit, no more (archive bombs)


@dataclass(frozen=True)
class CodeInfo:
    digest: str
    bytes: int
    files: int


class CodeStore:
    def __init__(self, root: Path, max_bytes: int, tenant_bytes: int):
        self.root = root
        self.max_bytes = max_bytes
        self.tenant_bytes = tenant_bytes

    def _folder(self, tenant_id: int) -> Path:
        return self.root / str(int(tenant_id))

    def _path(self, tenant_id: int, digest: str) -> Path:
        if not DIGEST_RE.match(digest):
            raise InvalidRequest(f"code {digest!r} is not a SHA-256 digest (64 lowercase hex digits)")
        return self._folder(tenant_id) / f"{digest}.tar.gz"

    def put(self, tenant_id: int, digest: str, data: bytes | bytearray) -> CodeInfo:
        """Keep ``data`` (a tar.gz whose SHA-256 is ``digest``) for ``tenant_id``; check it unpacks."""
        path = self._path(tenant_id, digest)
        if len(data) > self.max_bytes:
            raise TooLarge(f"the code archive is {len(data) >> 20} MiB; the limit is {self.max_bytes >> 20} "
                           "MiB: leave data and outputs out of the folder (put data in a dataset)")
        if hashlib.sha256(data).hexdigest() != digest:
            raise InvalidRequest("the code archive's SHA-256 is not the digest in the URL; it was damaged or "
                                 "the URL names other code: send it again")
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # all or nothing: a half-written or refused archive is never seen
        with atomic_file(path) as f:
            f.write(data)
            f.flush()
            members = self._check(f.name)  # read back from the file: no second copy in memory
        self._evict(tenant_id, keep=path)
        return CodeInfo(digest, len(data), members)

    def _check(self, archive: str) -> int:
        """Refuse what would not unpack safely: not a tar.gz, too many files, too large unpacked."""
        try:
            with tarfile.open(archive, mode="r:gz") as tar:
                files, size = 0, 0
                for m in tar:
                    files += 1
                    size += m.size
                    if files > MAX_FILES or size > self.max_bytes * UNPACKED_RATIO:
                        raise InvalidRequest(
                            f"the code archive holds more than {MAX_FILES} files or "
                            f"{(self.max_bytes * UNPACKED_RATIO) >> 20} MiB unpacked; leave data, "
                            "environments and outputs out of the folder")
                    if m.name.startswith("/"):
                        raise tarfile.AbsolutePathError(m)
                    tarfile.data_filter(m, "/nonexistent")  # raises on links and paths out, devices
        except tarfile.FilterError as exc:
            raise InvalidRequest(f"the code archive holds {exc}; send only files and folders inside it") from None
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise InvalidRequest(f"the code is not a readable tar.gz archive ({exc}); send it with the CLI "
                                 "or the SDK") from None
        return files

    def _evict(self, tenant_id: int, keep: Path) -> None:
        archives = sorted(self._folder(tenant_id).glob("*.tar.gz"), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in archives)
        for p in archives:
            if total <= self.tenant_bytes:
                break
            if p != keep:
                total -= p.stat().st_size
                p.unlink(missing_ok=True)

    def has(self, tenant_id: int, digest: str) -> bool:
        return self._path(tenant_id, digest).is_file()

    def unpack(self, tenant_id: int, digest: str, dest: Path) -> None:
        """Unpack the tenant's archive into ``dest`` (an empty folder, made if missing); files
        only, nothing outside it."""
        path = self._path(tenant_id, digest)
        try:
            os.utime(path)  # recently used: evicted last
            tar = tarfile.open(path, mode="r:gz")
        except FileNotFoundError:
            raise NotFound(f"no code {digest[:12]}... was sent by your tenant (or it was dropped to make room); "
                           f"send it with PUT /v1/code/{digest} and submit again") from None
        dest.mkdir(parents=True, exist_ok=True, mode=0o755)
        with tar:
            tar.extractall(dest, filter="data")

    def prune(self, older_than_s: float, now: float | None = None) -> int:
        """Drop archives unused for ``older_than_s`` seconds; how many went."""
        cutoff = (now or time.time()) - older_than_s
        gone = 0
        for p in self.root.glob("*/*.tar.gz") if self.root.is_dir() else []:
            if p.stat().st_mtime < cutoff:
                p.unlink(missing_ok=True)
                gone += 1
        return gone


def staged(dest_parent: Path) -> Path:
    """A fresh folder to unpack into before the job has an id (removed by the caller)."""
    dest_parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=".code-", dir=dest_parent))


def discard(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
