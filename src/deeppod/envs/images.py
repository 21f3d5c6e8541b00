"""Container images a job may run in (``--image NAME``): archives the administrator put in
DEEPPOD_IMAGE_DIR, unpacked once per node into a root file system that the job's sandbox
is built on (executor/sandbox.py: the same identity, mounts, devices, limits and job
contract as any sandboxed job; only the programs and libraries are the image's).

An archive is ``NAME.tar`` (or ``.tar.gz``, ``.tgz``): what ``podman save`` / ``docker
save`` write (an OCI layout or a Docker archive: layers applied in order, whiteouts
honoured, the image's ENV and WORKDIR kept), or a flat root file system (``podman export``).
Unpacked as root from the administrator's own file, into root's folder, with tarfile's
``tar`` filter: no member lands outside it, no setuid bit is kept, and the result is
mounted read-only, nosuid and nodev. Standard library only (the supervisor uses it).

``ENV_DIR/images/``::

    <key>/          the image's root file system (key: the archive's path, size and mtime)
    <key>.json      written last, when it was unpacked: its name, ENV, WORKDIR, size
    <key>.used      touched at each start that uses it (least recently used go first)
    <key>.lock      held while it is unpacked
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import os
import posixpath
import re
import shutil
import tarfile
import time
from pathlib import Path

from deeppod.envs.build import once, ready_file, say
from deeppod.errors import EnvBuildFailed, InvalidRequest
from deeppod.nofollow import tree_bytes

SUFFIXES = (".tar.gz", ".tgz", ".tar")
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RUNTIME = "/.deeppod"  # in an image's sandbox: the platform's deeppod package (deeppod.runtime), read-only
# the files a job in an image gets from the host (a container runtime's usual set)
HOST_FILES = ("etc/resolv.conf", "etc/hosts")
# the NVIDIA driver's user-space libraries: they must match the host's kernel module, so a
# worker with GPUs gets the host's, read-only, on its LD_LIBRARY_PATH (as the NVIDIA container toolkit does)
DRIVER_LIBS = ("libcuda.so*", "libnvidia-ml.so*", "libnvidia-ptxjitcompiler.so*", "libnvidia-nvvm.so*",
               "libcudadebugger.so*")
DRIVER_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
               "/usr/local/nvidia/lib64")


def offered(image_dir: str | None) -> dict[str, Path]:
    """The images this server offers: name -> archive."""
    if not image_dir or not os.path.isdir(image_dir):
        return {}
    found = {}
    for entry in sorted(os.listdir(image_dir)):
        for suffix in SUFFIXES:
            if entry.endswith(suffix) and NAME.match(entry[:-len(suffix)]):
                path = Path(image_dir) / entry
                if path.is_file():
                    found.setdefault(entry[:-len(suffix)], path)
                break
    return dict(sorted(found.items()))


def check_name(image: str | None, image_dir: str | None) -> str | None:
    """A job's ``--image``: a name this server offers (never a path or URL), or None."""
    if image is None:
        return None
    if not image_dir:
        raise InvalidRequest(f"this server runs no container images (--image {image!r}): leave it out, or ask the "
                             "administrator to set DEEPPOD_IMAGE_DIR")
    images = offered(image_dir)
    if image not in images:
        listed = ", ".join(images) or "none yet"
        raise InvalidRequest(f"no image {image!r} on this server: give one of the names it offers ({listed}); "
                             "'deeppod images ls' lists them")
    return image


def key(archive: Path) -> str:
    """Names one unpacking of an archive: a changed file is unpacked again."""
    st = archive.stat()
    doc = f"{archive.resolve()}\0{st.st_size}\0{st.st_mtime_ns}"
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def image_path(order: dict) -> Path:
    return Path(order["root"]) / order["key"]


def order_for(name: str, image_dir: str, env_root: str) -> dict:
    """What the supervisor unpacks (or finds unpacked) before a job in image ``name`` starts."""
    archive = offered(image_dir).get(name)
    if archive is None:
        raise EnvBuildFailed(f"image {name!r} is no longer offered by this server (its archive is gone from "
                             f"{image_dir})")
    return {"image": name, "archive": str(archive), "key": key(archive), "root": str(Path(env_root) / "images")}


def ensure(order: dict, log) -> Path:
    """The image ``order`` names, unpacked if it is not yet; its root file system's path.
    ``log``: a binary file that progress goes to (the job's log)."""
    root = Path(order["root"])
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    final = image_path(order)
    return once(final, log, lambda: _unpack_into(order, root, final, log),
                found=f"image {order['image']}: ready (unpacked before)",
                waiting=f"waiting for another job's unpacking of image {order['image']}")


def _unpack_into(order: dict, root: Path, final: Path, log) -> None:
    started = time.monotonic()
    ready_file(final).unlink(missing_ok=True)
    shutil.rmtree(final, ignore_errors=True)
    staging = root / f".staging-{order['key']}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o755)
    say(log, f"unpacking image {order['image']} from {order['archive']}")
    try:
        config = unpack(Path(order["archive"]), staging)
        for name in HOST_FILES:  # where the host's are mounted (the image is read-only in the sandbox)
            target = staging / name
            if not os.path.lexists(target) and target.parent.is_dir() and not target.parent.is_symlink():
                target.touch()
        os.rename(staging, final)
        ready_file(final).write_text(json.dumps({
            "key": order["key"], "image": order["image"], "archive": order["archive"], "built_at": time.time(),
            "env": list(config.get("Env") or []), "workdir": config.get("WorkingDir") or "",
            "bytes": tree_bytes(final)}))
        say(log, f"image {order['image']} unpacked in {time.monotonic() - started:.1f} s")
    except (tarfile.TarError, OSError, ValueError, KeyError) as exc:
        raise EnvBuildFailed(f"image {order['image']} ({order['archive']}) cannot be unpacked: {exc} (give an "
                             "archive that 'podman save', 'docker save' or 'podman export' wrote)") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def unpack(archive: Path, dest: Path) -> dict:
    """Unpack ``archive`` into the empty folder ``dest``; the image's config (its ENV and
    WORKDIR), {} for a flat root file system."""
    with tarfile.open(archive, "r:*") as outer:
        names = set(outer.getnames())
        if "index.json" in names and "oci-layout" in names:
            layers, config = _oci(outer)
        elif "manifest.json" in names:
            layers, config = _docker(outer)
        else:  # a flat root file system (podman export)
            _apply(outer, dest)
            return {}
        for layer in layers:
            blob = outer.extractfile(layer)
            if blob is None:
                raise ValueError(f"layer {layer} is missing from the archive")
            with tarfile.open(fileobj=blob, mode="r|*") as t:
                _apply(t, dest)
        return config


def _json(outer: tarfile.TarFile, name: str) -> dict:
    f = outer.extractfile(posixpath.normpath(name))
    if f is None:
        raise ValueError(f"{name} is missing from the archive")
    data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return json.loads(data)


def _blob(digest: str) -> str:
    algorithm, _, value = digest.partition(":")
    if not re.fullmatch(r"[a-z0-9]+", algorithm) or not re.fullmatch(r"[a-f0-9]+", value):
        raise ValueError(f"{digest!r} is not a digest")
    return f"blobs/{algorithm}/{value}"


def _oci(outer: tarfile.TarFile) -> tuple[list[str], dict]:
    index = _json(outer, "index.json")
    manifests = index.get("manifests") or []
    if not manifests:
        raise ValueError("index.json names no image")
    manifest = _json(outer, _blob(manifests[0]["digest"]))
    if "manifests" in manifest:  # an image index (several platforms): this machine's
        arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
        pick = [m for m in manifest["manifests"] if (m.get("platform") or {}).get("architecture") == arch]
        manifest = _json(outer, _blob((pick or manifest["manifests"])[0]["digest"]))
    config = _json(outer, _blob(manifest["config"]["digest"])).get("config") or {}
    return [_blob(layer["digest"]) for layer in manifest.get("layers", [])], config


def _docker(outer: tarfile.TarFile) -> tuple[list[str], dict]:
    manifest = _json(outer, "manifest.json")[0]
    config = _json(outer, manifest["Config"]).get("config") or {}
    return [posixpath.normpath(layer) for layer in manifest["Layers"]], config


def _apply(layer: tarfile.TarFile, dest: Path) -> None:
    """One layer onto ``dest``: its whiteouts remove what earlier layers put there; every
    member checked by the ``tar`` filter (nothing outside ``dest``, no setuid bits)."""
    base = os.path.realpath(dest)
    for member in layer:
        head, leaf = posixpath.split(posixpath.normpath(member.name.lstrip("/")))
        if member.ischr() or member.isblk() or member.isfifo() or leaf in ("", ".", ".."):
            continue  # no device nodes from an image (its sandbox's /dev is made apart)
        # where it lands, its folder's links followed: checked before anything is removed there
        parent = _inside(base, os.path.join(base, head), member.name)
        if leaf == ".wh..wh..opq":  # an opaque folder: what earlier layers put in it goes
            for entry in os.listdir(parent) if os.path.isdir(parent) else []:
                _remove(os.path.join(parent, entry))
        elif leaf.startswith(".wh."):  # a whiteout: an earlier layer's file goes
            if leaf[4:] not in ("", ".", ".."):
                _remove(os.path.join(parent, leaf[4:]))
        else:
            if member.islnk():  # a hard link is made to a file already unpacked, never to one outside
                _inside(base, os.path.join(base, member.linkname.lstrip("/")), member.name)
            target = os.path.join(parent, leaf)
            if os.path.lexists(target) and not (member.isdir() and os.path.isdir(target)
                                                and not os.path.islink(target)):
                _remove(target)  # a later layer's file replaces an earlier one's
            layer.extract(member, base, filter="tar")


def _inside(base: str, path: str, name: str) -> str:
    """``path`` with its links followed, refused unless it is in the image at ``base``."""
    real = os.path.realpath(path)
    if os.path.commonpath([real, base]) != base:
        raise ValueError(f"{name} points outside the image")
    return real


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def activate(order: dict, env: dict[str, str], gpus: bool) -> dict[str, str]:
    """A worker's environment in its image: the image's ENV under the job contract's, the
    image's PATH, and deeppod.runtime importable."""
    doc = json.loads(ready_file(image_path(order)).read_text())
    image_env = dict(e.split("=", 1) for e in doc.get("env", []) if "=" in e)
    out = {**image_env, **{k: v for k, v in env.items() if k not in ("PATH", "VIRTUAL_ENV", "PYTHONHOME")}}
    out["PATH"] = image_env.get("PATH", DEFAULT_PATH)
    out["PYTHONPATH"] = ":".join(p for p in (env.get("PYTHONPATH"), image_env.get("PYTHONPATH"), RUNTIME) if p)
    if gpus:
        out["LD_LIBRARY_PATH"] = ":".join(p for p in (image_env.get("LD_LIBRARY_PATH"), f"{RUNTIME}-driver") if p)
    return out


def driver_libraries(dirs: tuple[str, ...] = DRIVER_DIRS) -> list[tuple[str, str]]:
    """The host's NVIDIA driver libraries, for a worker with GPUs: (file name, path), the
    first folder's where two hold one."""
    found: dict[str, str] = {}
    for folder in dirs:
        for pattern in DRIVER_LIBS:
            for path in sorted(glob.glob(os.path.join(folder, pattern))):
                found.setdefault(os.path.basename(path), path)
    return sorted(found.items())
