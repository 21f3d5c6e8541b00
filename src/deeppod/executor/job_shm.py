"""A sandboxed job's /dev/shm on a node: a tmpfs of its own, no larger than the memory its
workers there may use together, owned by the job's identity and gone with the job. Its pages
are charged to the worker that writes them; the size bounds what any of them (a spare that
exited too) can leave there, and the unmount at the job's end frees it.

The mount point is a folder of root's under the host's /dev/shm: that folder is sticky and
world-writable, and an entry owned by root cannot be removed or replaced by the job, so the
path root mounts on is never one the job made. It is opened without following a link and
mounted through its descriptor all the same. Standard library only (the supervisor's)."""

from __future__ import annotations

import os
import stat

from deeppod.executor.syscalls import mount, umount

MS_NOSUID, MS_NODEV, MS_REMOUNT = 0x2, 0x4, 0x20
MNT_DETACH = 0x2


def _open_folder(path: str) -> int:
    """``path``'s folder, made root's and private if it is not there; never a link."""
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        pass
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    return fd


def _mounted(fd: int, path: str) -> bool:
    parent = os.open(os.path.dirname(path.rstrip("/")) or "/", os.O_RDONLY | os.O_DIRECTORY)
    try:
        return os.fstat(fd).st_dev != os.fstat(parent).st_dev
    finally:
        os.close(parent)


def mount_shm(path: str, uid: int, gid: int, size_mb: int | None) -> None:
    """The job's tmpfs at ``path`` (sized ``size_mb``; None: unsized, as a job with no memory
    limit); mounted already (a grow, a restarted supervisor): resized."""
    fd = _open_folder(path)
    try:
        opts = f"mode=0700,uid={uid},gid={gid}" + (f",size={size_mb}m" if size_mb else "")
        if _mounted(fd, path):
            mount(None, f"/proc/self/fd/{fd}", None, MS_REMOUNT | MS_NOSUID | MS_NODEV, opts)
            return
        st = os.fstat(fd)
        if st.st_uid != 0:  # a folder of the job's own (made by a server before this one): root's now
            os.fchown(fd, 0, 0)
        os.fchmod(fd, 0o755)
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(20, f"{path} is not a folder")
        mount("tmpfs", f"/proc/self/fd/{fd}", "tmpfs", MS_NOSUID | MS_NODEV, opts)
    finally:
        os.close(fd)


def unmount_shm(path: str) -> None:
    """The job's tmpfs gone (its pages freed); nothing there, or not a mount: nothing to do."""
    try:
        umount(path, MNT_DETACH)
    except OSError:
        pass
