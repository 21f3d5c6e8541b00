"""The control plane's side of an in-place resize (the job's side: runtime/resize.py).

The controller writes the job's world file (``JOB_DIR/world/world.json``, read-only to the
job): a generation, the new size and a fresh rendezvous port; on a grow, only once the new
workers (started first) say they are ready, so the others train meanwhile. A job that uses
``runtime.Resizer`` marks itself resizable and, after its first step at the new size,
acknowledges the generation in its checkpoint folder; the controller then trims the
workers that left from the job's allocation and records how long the switch took.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from deeppod.contract import JOINER_READY, RESIZABLE_MARK, SPARE_PARKED, WORLD_ACK

#: an in-place resize not acknowledged within this many seconds falls back to a restart
IN_PLACE_TIMEOUT_S = 180.0
_ACK_MAX_BYTES = 4096


def world_file(job_dir: Path) -> Path:
    return job_dir / "world" / "world.json"


def reset_world(job_dir: Path, ckpt: Path) -> Path:
    """A new run starts at generation 0: no world file, no mark or answer from the last run."""
    folder = job_dir / "world"
    folder.mkdir(exist_ok=True)
    world_file(job_dir).unlink(missing_ok=True)
    for name in (RESIZABLE_MARK, WORLD_ACK):
        (ckpt / name).unlink(missing_ok=True)
    for pattern in (JOINER_READY.format(rank="*"), SPARE_PARKED.format(n="*")):
        for mark in ckpt.glob(pattern):
            mark.unlink(missing_ok=True)
    return folder


def joiners_ready(ckpt: Path, ranks: list[int]) -> bool:
    """Every new worker of a grow has built its model and waits for the others."""
    return all(os.path.lexists(ckpt / JOINER_READY.format(rank=r)) for r in ranks)


def clear_ready(ckpt: Path, ranks: list[int]) -> None:
    for r in ranks:
        (ckpt / JOINER_READY.format(rank=r)).unlink(missing_ok=True)


def write_world(job_dir: Path, world: dict) -> None:
    path = world_file(job_dir)
    tmp = path.with_name(".world.json.tmp")
    tmp.write_text(json.dumps(world))
    os.chmod(tmp, 0o644)  # the job reads it (its sandbox binds the folder read-only)
    os.replace(tmp, path)


def resizable(ckpt: Path) -> bool:
    """The job's rank 0 said it can resize in place (it made a ``runtime.Resizer``)."""
    return os.path.lexists(ckpt / RESIZABLE_MARK)


def read_ack(ckpt: Path) -> dict | None:
    """The job's answer, from a folder the job owns: no links followed, small, a dict or nothing."""
    try:
        fd = os.open(ckpt / WORLD_ACK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        data = os.read(fd, _ACK_MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > _ACK_MAX_BYTES:
        return None
    try:
        ack = json.loads(data)
    except ValueError:
        return None
    return ack if isinstance(ack, dict) and isinstance(ack.get("generation"), int) else None
