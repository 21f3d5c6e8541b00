"""A model artifact on disk: check it is servable, copy it into the registry atomically, never
following a link a job planted (the folder may be the job's own). Two kinds: an image model
(model.pt2 + signature.json) and a language model's Hugging Face folder (models/hf.py)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path

from deeppod.atomic import move_into_place
from deeppod.errors import Forbidden, InvalidRequest
from deeppod.models import hf
from deeppod.nofollow import open_dir, open_regular

SERVING_FILE = "model.pt2"  # torch.export program: self-contained, no Python class needed
SIGNATURE_FILE = "signature.json"
ARTIFACT_FILES = (SERVING_FILE, SIGNATURE_FILE, "weights.pt")
MAX_SIGNATURE_BYTES = 4 << 20


@dataclass(frozen=True)
class Artifact:
    path: Path
    signature: dict
    sha256: str
    bytes: int


def check_signature(sig: object, where: str) -> dict:
    """What serving and evaluation rely on; anything else in the signature is kept as is."""
    def bad(what: str) -> InvalidRequest:
        return InvalidRequest(f"{where}: {what}. The built-in trainer writes a valid one; see docs/models.md")

    if not isinstance(sig, dict):
        raise bad("the signature must be a JSON object")
    classes = sig.get("classes")
    if not isinstance(classes, list) or len(classes) < 2 or not all(isinstance(c, str) for c in classes):
        raise bad("'classes' must list at least two class names")
    inp = sig.get("input")
    if not isinstance(inp, dict) or inp.get("kind") != "image":
        raise bad("'input.kind' must be 'image' (the only kind served for now)")
    shape = inp.get("shape")
    if not (isinstance(shape, list) and len(shape) == 3 and all(isinstance(v, int) and v > 0 for v in shape)
            and shape[0] == 3 and shape[1] == shape[2] and shape[1] <= 4096):
        raise bad("'input.shape' must be [3, size, size] (RGB images, square input)")
    for key in ("mean", "std"):
        v = inp.get(key)
        if not (isinstance(v, list) and len(v) == shape[0] and all(isinstance(x, (int, float)) for x in v)):
            raise bad(f"'input.{key}' must hold {shape[0]} numbers")
    if any(x == 0 for x in inp["std"]):
        raise bad("'input.std' must not hold a zero")
    if inp.get("crop", "squash") not in ("center", "squash"):
        raise bad("'input.crop' must be 'center' or 'squash'")
    return sig


def read_signature(folder: Path) -> dict:
    """An artifact folder checked (regular files, not links; both there) and its signature,
    checked, read with no link followed; the serving file is not read (a search's chance
    check needs the classes only; registering checks again what it copies)."""
    try:
        dir_fd = open_dir(folder)
    except FileNotFoundError:
        raise InvalidRequest(f"{folder} is not a folder; a model artifact folder holds {SERVING_FILE} and "
                             f"{SIGNATURE_FILE} (the built-in trainer writes JOB_DIR/model)") from None
    except OSError as exc:
        raise InvalidRequest(f"{folder} cannot be read as a folder without following a link ({exc.strerror}); "
                             "register a folder the job wrote") from None
    try:
        names = set(os.listdir(dir_fd))
        if SERVING_FILE not in names and hf.is_hf_folder(names):
            return hf.describe(dir_fd, names, str(folder))[0]
        found = {}
        for name in ARTIFACT_FILES:
            try:
                found[name] = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
        links = [f for f, st in found.items() if stat.S_ISLNK(st.st_mode)]
        if links:  # the server copies as itself: a link could point at anything it can read
            raise InvalidRequest(f"{folder}: {', '.join(links)} must be files, not links")
        missing = [f for f in (SERVING_FILE, SIGNATURE_FILE) if f not in found or not stat.S_ISREG(found[f].st_mode)]
        if missing:
            raise InvalidRequest(f"{folder} has no {' or '.join(missing)}: a model artifact needs {SERVING_FILE} "
                                 f"(torch.export.save) and {SIGNATURE_FILE}; did the job finish writing it?")
        data = _read_regular(dir_fd, SIGNATURE_FILE, folder)
    finally:
        os.close(dir_fd)
    try:
        sig = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"{folder / SIGNATURE_FILE} is not valid JSON ({exc})") from None
    return check_signature(sig, str(folder / SIGNATURE_FILE))


def _read_regular(dir_fd: int, name: str, folder: Path) -> bytes:
    """A small file of ``folder`` read through its descriptor: a regular file, no link followed."""
    try:
        fd, st = open_regular(dir_fd, name)
    except OSError as exc:
        raise InvalidRequest(f"{folder}: {name} cannot be read as a regular file ({exc.strerror}; files, "
                             "not links)") from None
    with os.fdopen(fd, "rb") as f:
        if st.st_size > MAX_SIGNATURE_BYTES:
            raise InvalidRequest(f"{folder / name} is over {MAX_SIGNATURE_BYTES} bytes")
        return f.read(MAX_SIGNATURE_BYTES + 1)


def take_in(folder: Path, dest: Path, max_bytes: int | None = None) -> Artifact:
    """Copy the artifact in ``folder`` (which a job may own and change meanwhile) to ``dest``
    and return what was kept: its signature, checked, and the hash of exactly the bytes copied.
    No link is followed, in ``folder``'s path or of its files, and only regular files are read;
    the copy is made in a staging folder beside ``dest``, fsynced, then renamed into place (a
    crash or a refusal leaves no half version). ``max_bytes``: what the copy may take at most
    (the tenant's storage quota left); a sparse file is refused, so bytes the job never wrote
    cannot become bytes the server writes."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.parent / f".staging-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        digest, size, language = _copy_files(folder, staging, max_bytes)
        sig = _hf_signature(staging, folder) if language else \
            _load_signature(staging / SIGNATURE_FILE, str(folder / SIGNATURE_FILE))
        move_into_place(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Artifact(dest, sig, digest, size)


SPARSE_SLACK = 1 << 20  # a file's allocated blocks may fall this far short of its size (its tail block, metadata)


def _hf_signature(staging: Path, folder: Path) -> dict:
    """A language model's signature from the bytes copied (the folder may have changed since)."""
    dir_fd = open_dir(staging)
    try:
        return hf.describe(dir_fd, set(os.listdir(dir_fd)), str(folder))[0]
    finally:
        os.close(dir_fd)


def _copy_files(folder: Path, staging: Path, max_bytes: int | None = None) -> tuple[str, int, bool]:
    """(sha256 of the weights, bytes copied, whether it is a language model folder)."""
    try:
        dir_fd = open_dir(folder)
    except OSError as exc:
        raise InvalidRequest(f"{folder} cannot be read as a folder without following a link ({exc.strerror}); "
                             "register a folder the job wrote") from None
    h, size = hashlib.sha256(), 0
    try:
        names = set(os.listdir(dir_fd))
        language = SERVING_FILE not in names and hf.is_hf_folder(names)
        files = hf.describe(dir_fd, names, str(folder))[1] if language else ARTIFACT_FILES
        for name in files:
            try:
                fd, st = open_regular(dir_fd, name)
            except FileNotFoundError:
                if name == "weights.pt":
                    continue
                raise InvalidRequest(f"{folder} has no {name}: a model artifact needs {SERVING_FILE} "
                                     f"(torch.export.save) and {SIGNATURE_FILE}; did the job finish "
                                     "writing it?") from None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise InvalidRequest(f"{folder}: {name} must be a file, not a link (files, not links)") from None
                raise InvalidRequest(f"{folder}: {name} must be a regular file ({exc.strerror})") from None
            with os.fdopen(fd, "rb") as src, open(staging / name, "wb") as out:
                if name == SIGNATURE_FILE and st.st_size > MAX_SIGNATURE_BYTES:
                    raise InvalidRequest(f"{folder / name} is over {MAX_SIGNATURE_BYTES} bytes")
                if st.st_blocks * 512 + SPARSE_SLACK < st.st_size:
                    raise InvalidRequest(f"{folder / name} is a sparse file ({st.st_size:,} bytes long, "
                                         f"{st.st_blocks * 512:,} written): a model's files are written whole "
                                         "(torch.export.save, torch.save); register what the job wrote")
                if max_bytes is not None and size + st.st_size > max_bytes:
                    raise _over_quota(folder, size + st.st_size, max_bytes)
                while chunk := src.read(1 << 20):
                    out.write(chunk)
                    size += len(chunk)
                    if max_bytes is not None and size > max_bytes:  # it grew while it was read
                        raise _over_quota(folder, size, max_bytes)
                    if name == SERVING_FILE or (language and name.endswith(".safetensors")):
                        h.update(chunk)
                out.flush()
                os.fsync(out.fileno())
    finally:
        os.close(dir_fd)
    return h.hexdigest(), size, language


def _over_quota(folder: Path, size: int, max_bytes: int) -> Forbidden:
    return Forbidden(f"the model in {folder} takes over {size / 1e9:.2f} GB, more than the {max_bytes / 1e9:.2f} GB "
                     "left of the tenant's storage quota (job folders, environments and registered models count): "
                     "remove old versions ('deeppod models rm NAME@V') or finished jobs' folders, or ask an "
                     "administrator to raise storage_gb", code="over_quota")


def _load_signature(path: Path, where: str) -> dict:
    if path.stat().st_size > MAX_SIGNATURE_BYTES:
        raise InvalidRequest(f"{where} is over {MAX_SIGNATURE_BYTES} bytes")
    try:
        sig = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"{where} is not valid JSON ({exc})") from None
    return check_signature(sig, where)


def sweep(root: Path) -> None:
    """Remove staging folders a crash left behind."""
    if root.is_dir():
        for leftover in root.glob("*/*/.staging-*"):
            shutil.rmtree(leftover, ignore_errors=True)
