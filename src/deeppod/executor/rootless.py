"""A worker in a container image where its cluster's scheduler starts it as the job's identity
(Slurm): no root to build a sandbox with, so the task's child enters a user namespace of its own
(its uid and gid mapped to themselves, nothing else) and a mount namespace, builds the image's
root there, chroots into it and runs the command as itself, with no capability left after the
exec. The kernel must let unprivileged users make user namespaces (``user.max_user_namespaces``
above 0, as enroot and rootless Apptainer need); where it does not, the worker ends with that.

The root is a tmpfs holding the image read-only: each entry of the image bound in, except the
folders on the way to a mount point, made on the tmpfs with their own entries bound one by one
(an overlay, as the root sandbox uses, cannot be written by an unprivileged user over the image's
root-owned folders). Then a private /tmp, the host's /proc, /sys and /dev (Slurm's cgroup bounds
the devices), its DNS files, deeppod.runtime, the NVIDIA driver's libraries for a worker with
GPUs, and the job's own binds (its workdir and folders writable, datasets read-only); the root is
made read-only last.

Standard library only (slurm_task.py runs it between fork and exec).
"""

from __future__ import annotations

import os
from pathlib import Path

from deeppod.envs import images
from deeppod.executor.syscalls import CLONE_NEWNS, PR_SET_NO_NEW_PRIVS, mount, prctl, unshare
from deeppod.nofollow import open_dir

CLONE_NEWUSER = 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
HOST = ("/proc", "/sys", "/dev")  # the host's, bound whole
PACKAGE = str(Path(images.__file__).resolve().parents[1])  # the deeppod the task runs (the site's), bound in


def mount_points(binds: list[list], gpus: bool) -> dict[str, str]:
    """Every mount point in the image's root and what goes there ("" for a fresh /tmp)."""
    points = {"/tmp": "", **{p: p for p in HOST}}
    for name in images.HOST_FILES:
        if os.path.isfile("/" + name):
            points["/" + name] = "/" + name
    points[f"{images.RUNTIME}/deeppod"] = PACKAGE
    if gpus:
        for name, path in images.driver_libraries():
            points[f"{images.RUNTIME}-driver/{name}"] = path
    for src, dst, _writable in binds:
        points[os.path.normpath(dst)] = src
    return points


def on_the_way(points) -> set[str]:
    """The folders above the mount points (not "/")."""
    return {str(parent) for p in points for parent in Path(p).parents if str(parent) != "/"}


def enter(image: str, binds: list[list], workdir: str, gpus: bool) -> None:
    """In the worker's child, before its exec: the image's root, entered, as the job's identity.
    OSError says which step failed."""
    uid, gid = os.getuid(), os.getgid()
    points = mount_points(binds, gpus)
    writable = {os.path.normpath(dst) for _src, dst, w in binds if w}
    _own_namespaces(uid, gid)
    # descriptors next (in this mount namespace: a bind takes only its own mounts), before the root
    # is mounted over the image's own path; a job's folder opened with no link followed in it
    fds = {dst: (_open_own(src) if dst in writable else os.open(src, os.O_PATH)) for dst, src in points.items() if src}
    image_fd = os.open(image, os.O_PATH | os.O_DIRECTORY)
    try:
        root = image
        mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
        _mirror(f"/proc/self/fd/{image_fd}", root, "", points, on_the_way(points))
        os.makedirs(root + "/tmp", exist_ok=True)
        mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
        for dst in sorted(fds, key=lambda d: d.count("/")):  # a folder before what is bound under it
            _bind(fds[dst], root + dst, writable=dst in writable, whole=dst in HOST)
        _remount(root, root, False)
        os.chroot(root)
        os.chdir(workdir)
        prctl(PR_SET_NO_NEW_PRIVS, 1)
    finally:
        for fd in [*fds.values(), image_fd]:
            os.close(fd)


def _open_own(src: str) -> int:
    try:
        return open_dir(src, flags=os.O_PATH)
    except OSError as exc:
        raise OSError(exc.errno, f"{src} cannot be opened as a folder without following a link "
                                 f"({exc.strerror})") from None


def _own_namespaces(uid: int, gid: int) -> None:
    try:
        unshare(CLONE_NEWUSER | CLONE_NEWNS)
    except OSError as exc:
        raise OSError(exc.errno, "this node's kernel does not let users make user namespaces (an administrator "
                                 "sets user.max_user_namespaces above 0), which a job in an image needs on "
                                 f"Slurm: {exc.strerror}") from None
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below reaches the host


def _mirror(image: str, root: str, rel: str, points: dict[str, str], way: set[str]) -> None:
    """The image's folder ``rel`` under ``root``: its entries bound read-only, links as links, the
    folders on the way to a mount point made here and mirrored in turn (made empty where the image
    has none, or has a link there)."""
    for name in os.listdir(image + rel):
        path, there = f"{rel}/{name}", f"{root}{rel}/{name}"
        if path in points or path in way:
            continue
        if os.path.islink(image + path):
            os.symlink(os.readlink(image + path), there)
        elif os.path.isdir(image + path):
            os.mkdir(there)
            _readonly(image + path, there)
        elif os.path.isfile(image + path):
            open(there, "w").close()
            _readonly(image + path, there)
    for path in sorted(p for p in way if os.path.dirname(p) == (rel or "/")):
        os.mkdir(root + path, 0o755)
        if os.path.isdir(image + path) and not os.path.islink(image + path):
            _mirror(image, root, path, points, way)
        else:
            _mirror_missing(root, path, way)


def _mirror_missing(root: str, rel: str, way: set[str]) -> None:
    for path in sorted(p for p in way if os.path.dirname(p) == rel):
        os.mkdir(root + path, 0o755)
        _mirror_missing(root, path, way)


# a bind mount's flags an unprivileged user may not drop (the kernel locks them): statvfs's bits -> mount's
_KEPT = ((os.ST_RDONLY, MS_RDONLY), (os.ST_NOEXEC, MS_NOEXEC), (os.ST_NOATIME, MS_NOATIME),
         (os.ST_NODIRATIME, MS_NODIRATIME), (os.ST_RELATIME, MS_RELATIME))


def _remount(src: str, dst: str, writable: bool) -> None:
    kept = os.statvfs(src).f_flag
    flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | (0 if writable else MS_RDONLY)
    mount(None, dst, None, flags | sum(ms for st, ms in _KEPT if kept & st))


def _readonly(src: str, dst: str) -> None:
    mount(src, dst, None, MS_BIND | MS_REC)
    _remount(src, dst, False)


def _bind(fd: int, dst: str, *, writable: bool, whole: bool) -> None:
    """What goes to mount point ``dst`` (through its descriptor), made if it is not there."""
    src = f"/proc/self/fd/{fd}"
    if not os.path.lexists(dst):
        if os.path.isdir(src):
            os.makedirs(dst, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            open(dst, "w").close()
    mount(src, dst, None, MS_BIND | MS_REC)
    if not whole:  # the host's /proc, /sys and /dev keep their own flags
        _remount(src, dst, writable)
