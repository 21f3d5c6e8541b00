"""Atomic replacement: the one place that renames a file into place, so a reader (another
process, a restarted server, a job) sees the old file or the new one, never a part.

Standard library only: the supervisor, the sandbox, the runtime inside jobs and the CLI use it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_file(path: Path | str, *, mode: int = 0o600, fsync: bool = False) -> Iterator[BinaryIO]:
    """A binary file to fill; renamed onto ``path`` when the block ends without an exception
    (with one, it is removed and ``path`` is untouched). It has ``mode`` from the start, so a
    private file is never readable by others, even for a moment. ``fsync``: on disk before the
    rename (a result a crash must not lose)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        os.close(fd)
        with open(tmp, "wb") as f:  # by name: ``f.name`` is where it is while it is filled
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write(path: Path | str, data: str | bytes, *, mode: int = 0o600, fsync: bool = False) -> None:
    """Write ``data`` to ``path`` atomically, with ``mode`` (private unless said otherwise)."""
    with atomic_file(path, mode=mode, fsync=fsync) as f:
        f.write(data.encode() if isinstance(data, str) else data)


def atomic_json(path: Path | str, doc: object, *, mode: int = 0o600, fsync: bool = False, indent=None) -> None:
    atomic_write(path, json.dumps(doc, indent=indent), mode=mode, fsync=fsync)


def move_into_place(src: Path | str, dest: Path | str) -> None:
    """Rename a finished file or folder onto ``dest`` (same file system): all or nothing."""
    os.replace(src, dest)


def fsync_dir(path: Path | str) -> None:
    """Make a rename into ``path`` (a folder) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
