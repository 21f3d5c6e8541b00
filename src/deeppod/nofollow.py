"""Touching what a job may change, as root, without following a link it planted: folders
opened component by component with ``O_NOFOLLOW``, trees walked through directory
descriptors (``os.fwalk``), files checked with ``fstat`` on the descriptor that is then read.

docs/security.md lists every place the server or the sandbox touches a job-writable path
and which of these it goes through. Standard library only: the sandbox uses it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def open_dir(path: Path | str, *, flags: int = os.O_RDONLY) -> int:
    """A descriptor of folder ``path`` (absolute), opened component by component with no link
    followed on the way (OSError, ELOOP or ENOTDIR, if a part is a link): any part of it may
    be a job's to change. ``flags``: os.O_PATH for a descriptor to bind-mount, not to read."""
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in Path(path).parts[1:]:
            nxt = os.open(part, flags | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except OSError:
        os.close(fd)
        raise
    return fd


def open_regular(dir_fd: int, name: str) -> tuple[int, os.stat_result]:
    """``name`` in the folder ``dir_fd``, opened for reading if it is a regular file and not a
    link (OSError otherwise: ELOOP for a link, EINVAL for anything else); the descriptor and
    its fstat, taken from what was opened, so nothing can be swapped in between."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise OSError(22, f"{name} is not a regular file")
    return fd, st


def read_small(path: Path, limit: int) -> bytes | None:
    """A small file a job wrote, read with no link followed in its path; None when it is not
    there, not a regular file, or over ``limit`` bytes."""
    try:
        dir_fd = open_dir(path.parent)
    except OSError:
        return None
    try:
        fd, st = open_regular(dir_fd, path.name)
    except OSError:
        return None
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1) if st.st_size <= limit else b"x" * (limit + 1)
    return None if len(data) > limit else data


def tree_bytes(path: Path | str, *, allocated: bool = True) -> int:
    """The disk a folder's files take (``allocated``: their blocks, so a sparse file counts what
    it holds; else their sizes), walked through descriptors, links neither followed nor
    counted; 0 if it is not a folder."""
    total = 0
    try:
        for _, _, files, dir_fd in os.fwalk(path, follow_symlinks=False):
            for name in files:
                try:
                    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                except OSError:  # gone meanwhile
                    continue
                if stat.S_ISREG(st.st_mode):
                    total += st.st_blocks * 512 if allocated else st.st_size
    except OSError:
        return total
    return total


def chown_tree(path: Path | str, uid: int, gid: int) -> None:
    """Give a folder and everything in it to ``uid``:``gid``; a link is given itself, never
    what it points at, and no folder is entered through one (``os.fwalk`` holds each
    folder's descriptor, so a folder swapped for a link meanwhile is not followed)."""
    for _, dirs, files, dir_fd in os.fwalk(path, topdown=False, follow_symlinks=False):
        for name in (*files, *dirs):
            os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
        os.chown(dir_fd, uid, gid)  # the folder itself, through its descriptor, after what it holds
