"""A model artifact on disk: check it is servable, copy it into the registry atomically."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from deeppod.errors import InvalidRequest

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


def inspect(folder: Path) -> Artifact:
    """An artifact folder checked, its signature read and its serving file hashed."""
    sig = read_signature(folder)
    h = hashlib.sha256()
    with open(folder / SERVING_FILE, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    size = sum((folder / f).stat().st_size for f in ARTIFACT_FILES if (folder / f).is_file())
    return Artifact(folder, sig, h.hexdigest(), size)


def read_signature(folder: Path) -> dict:
    """An artifact folder checked (files, not links; both there) and its signature, checked;
    the serving file is not read (a search's chance check needs the classes only)."""
    if not folder.is_dir():
        raise InvalidRequest(f"{folder} is not a folder; a model artifact folder holds {SERVING_FILE} and "
                             f"{SIGNATURE_FILE} (the built-in trainer writes JOB_DIR/model)")
    links = [f for f in ARTIFACT_FILES if (folder / f).is_symlink()]
    if links:  # the server copies as itself: a link could point at anything it can read
        raise InvalidRequest(f"{folder}: {', '.join(links)} must be files, not links")
    missing = [f for f in (SERVING_FILE, SIGNATURE_FILE) if not (folder / f).is_file()]
    if missing:
        raise InvalidRequest(f"{folder} has no {' or '.join(missing)}: a model artifact needs {SERVING_FILE} "
                             f"(torch.export.save) and {SIGNATURE_FILE}; did the job finish writing it?")
    if (folder / SIGNATURE_FILE).stat().st_size > MAX_SIGNATURE_BYTES:
        raise InvalidRequest(f"{folder / SIGNATURE_FILE} is over {MAX_SIGNATURE_BYTES} bytes")
    try:
        sig = json.loads((folder / SIGNATURE_FILE).read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"{folder / SIGNATURE_FILE} is not valid JSON ({exc})") from None
    return check_signature(sig, str(folder / SIGNATURE_FILE))


def copy_in(artifact: Artifact, dest: Path) -> None:
    """Copy to a staging folder beside ``dest``, fsync, then rename: a crash leaves no half version."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.parent / f".staging-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        for name in ARTIFACT_FILES:
            src = artifact.path / name
            if src.is_file():
                shutil.copyfile(src, staging / name)
                with open(staging / name, "rb") as f:
                    os.fsync(f.fileno())
        os.rename(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def sweep(root: Path) -> None:
    """Remove staging folders a crash left behind."""
    if root.is_dir():
        for leftover in root.glob("*/*/.staging-*"):
            shutil.rmtree(leftover, ignore_errors=True)
