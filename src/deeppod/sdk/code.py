"""A folder packed to send with a job: a tar.gz named by its SHA-256.

The same files give the same archive (sorted, no owners, a gzip header without a time), so
sending a folder again costs no copy on the server. Left out: version-control folders,
virtual environments, caches, and what ``.deeppodignore`` names (one glob per line, matched
against each path relative to the folder and against its name).
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import os
import tarfile
from dataclasses import dataclass

from deeppod.errors import InvalidRequest

SKIPPED = {".git", ".hg", ".svn", ".venv", "venv", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache",
           ".tox", ".ipynb_checkpoints", "node_modules", ".deeppod"}
MAX_TOTAL_BYTES = 400 << 20  # what the server unpacks at most (4 x its default archive limit)


@dataclass(frozen=True)
class Packed:
    data: bytes
    digest: str
    files: int
    left_out: int  # symbolic links that point outside the folder


def _ignored(folder: str) -> list[str]:
    try:
        with open(os.path.join(folder, ".deeppodignore")) as f:
            return [line.strip().rstrip("/") for line in f if line.strip() and not line.startswith("#")]
    except FileNotFoundError:
        return []


def _skip(rel: str, name: str, patterns: list[str]) -> bool:
    return name in SKIPPED or name.endswith(".pyc") or any(
        fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(name, p) for p in patterns)


def pack(folder: str | os.PathLike) -> Packed:
    """Pack ``folder``'s files (not following links out of it) into a deterministic tar.gz."""
    root = os.path.realpath(folder)
    if not os.path.isdir(root):
        raise InvalidRequest(f"{folder} is not a folder: send a folder with the job")
    patterns = _ignored(root)
    entries: list[tuple[str, str]] = []  # (relative name, path)
    left_out = total = 0
    for here, dirs, files in os.walk(root):
        rel_here = os.path.relpath(here, root)
        dirs[:] = sorted(d for d in dirs if not _skip(os.path.normpath(os.path.join(rel_here, d)), d, patterns))
        for name in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(here, d))]:
            rel = os.path.normpath(os.path.join(rel_here, name))
            path = os.path.join(here, name)
            if _skip(rel, name, patterns):
                continue
            if os.path.islink(path):
                target = os.path.realpath(path)
                if not target.startswith(root + os.sep) or os.path.isabs(os.readlink(path)):
                    left_out += 1
                    continue
            elif not os.path.isfile(path):
                continue  # sockets, pipes, devices
            else:
                total += os.path.getsize(path)
                if total > MAX_TOTAL_BYTES:
                    raise InvalidRequest(
                        f"{folder} holds more than {MAX_TOTAL_BYTES >> 20} MiB of files to send with the job; leave "
                        "data and outputs out (a dataset, or a .deeppodignore line per glob), or give --workdir "
                        "a folder on the server")
            entries.append((rel, path))
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(here, d))]
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w",
                                                                            format=tarfile.PAX_FORMAT) as tar:
        for rel, path in entries:
            info = tar.gettarinfo(path, arcname=rel)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.isfile():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    data = buf.getvalue()
    return Packed(data, hashlib.sha256(data).hexdigest(), len(entries), left_out)
