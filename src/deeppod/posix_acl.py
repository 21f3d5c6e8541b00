"""Letting one identity read a folder of the server's, and nobody else: a POSIX ACL entry for
that uid (``setfacl -R -m u:UID:rX``), written as the kernel's own extended attribute, so no
package is needed. Used where a job's processes run as its identity with no sandbox to bind
what it may read into (the Slurm executor: its datasets).

The tree is walked through descriptors (``os.fwalk``), no link followed or given anything;
a file is opened with ``O_NOFOLLOW`` and checked with ``fstat`` before its ACL is written.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from pathlib import Path

XATTR = "system.posix_acl_access"
_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_NO_ID = 0xFFFFFFFF
_ENTRY = struct.Struct("<HHI")


class AclUnsupported(OSError):
    """The file system keeps no POSIX ACLs (or they are switched off)."""


def _entries(fd: int, mode: int) -> dict[tuple[int, int], int]:
    """The file's ACL as (tag, id) -> permission bits: its own, or the one its mode means."""
    try:
        raw = os.getxattr(fd, XATTR)
    except OSError as exc:
        if exc.errno not in (errno.ENODATA, errno.EOPNOTSUPP):
            raise
        raw = b""
    if len(raw) >= 4 and (len(raw) - 4) % _ENTRY.size == 0:
        return {(tag, ident): perm for tag, perm, ident in _ENTRY.iter_unpack(raw[4:])}
    return {(_USER_OBJ, _NO_ID): (mode >> 6) & 7, (_GROUP_OBJ, _NO_ID): (mode >> 3) & 7,
            (_OTHER, _NO_ID): mode & 7}


def _grant(fd: int, uid: int, perm: int) -> None:
    """Add ``perm`` for ``uid`` to the file's ACL, and to its mask (which bounds every named entry)."""
    st = os.fstat(fd)
    acl = _entries(fd, st.st_mode)
    acl[(_USER, uid)] = acl.get((_USER, uid), 0) | perm
    # the mask bounds the group class: as setfacl does, the union of what its entries grant
    acl[(_MASK, _NO_ID)] = 0
    for (tag, _), p in list(acl.items()):
        if tag in (_USER, _GROUP, _GROUP_OBJ):
            acl[(_MASK, _NO_ID)] |= p
    raw = struct.pack("<I", _VERSION) + b"".join(_ENTRY.pack(tag, p, ident) for (tag, ident), p in sorted(acl.items()))
    try:
        os.setxattr(fd, XATTR, raw)
    except OSError as exc:
        if exc.errno == errno.EOPNOTSUPP:
            raise AclUnsupported(exc.errno, "the file system keeps no POSIX ACLs") from None
        raise


def grant_cross(path: Path | str, uid: int) -> None:
    """Let ``uid`` cross every folder above ``path`` (absolute) that others may not cross: to
    reach what is its own (a tenant's environment) or what it is given, and list none of them."""
    for parent in reversed(Path(path).parents):
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            if not os.fstat(fd).st_mode & stat.S_IXOTH:
                _grant(fd, uid, 1)
        finally:
            os.close(fd)


def grant_read(path: Path | str, uid: int) -> None:
    """Let ``uid`` read ``path`` (absolute): a file, or a folder and all it holds (folders: list
    and cross; files: read); and cross every folder above it that others may not cross.
    AclUnsupported where the file system keeps no ACLs."""
    path = Path(path)
    grant_cross(path, uid)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            _grant(fd, uid, 4)
            return
    finally:
        os.close(fd)
    for _, _, files, dir_fd in os.fwalk(path, follow_symlinks=False):
        _grant(dir_fd, uid, 5)
        for name in files:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
            except OSError:  # a link (not given anything), or gone meanwhile
                continue
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    _grant(fd, uid, 4)
            finally:
                os.close(fd)



def keep_private(path: Path | str) -> None:
    """Nobody but the owner may list, read or cross the folder ``path``, except whom an entry here
    let cross it: a plain chmod 0700 would set the ACL's mask to no permission and void every entry
    (a job on Slurm reading its dataset through the folder would lose it at the server's restart)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        named = any(tag in (_USER, _GROUP) for tag, _ in _entries(fd, mode))
        os.fchmod(fd, mode & 0o770 if named else 0o700)  # with entries, the group bits are their mask
    finally:
        os.close(fd)
