"""What a job's checkpoint folder says about its progress, framework-agnostic.

Any file a job writes under ``DEEPPOD_CHECKPOINT_DIR`` counts as a checkpoint; files named
the way ``deeppod.runtime`` names them (``ckpt-<step>.pt``) also give the step. The reconcile
loop uses this to tell the truth when a run ends on a stop: saved on the way out, an older
checkpoint to go back to, or nothing at all.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from deeppod.runtime.checkpoint import step_of


@dataclass(frozen=True)
class Latest:
    mtime: float  # seconds since the epoch
    step: int | None  # when the name tells it


def latest(folder: Path) -> Latest | None:
    """The newest file in a checkpoint folder (temporary files of a save in progress skipped)."""
    best: tuple[float, str] | None = None
    try:
        with os.scandir(folder) as entries:
            for e in entries:
                if e.name.startswith(".") or e.name.endswith(".tmp"):
                    continue
                m = e.stat(follow_symlinks=False).st_mtime
                if best is None or m > best[0]:
                    best = (m, e.name)
    except OSError:
        return None
    return None if best is None else Latest(best[0], step_of(best[1]))


def checkpoint_time(folder: Path) -> float | None:
    found = latest(folder)
    return None if found is None else found.mtime


def _at(found: Latest) -> str:
    return f"at step {found.step}" if found.step is not None else "(a file in its checkpoint folder)"


def stop_outcome(folder: Path, stop_requested_at: float | None) -> str:
    """One line on what a stopped run kept: for the job's reason and its events."""
    found = latest(folder)
    if found is None:
        return "no checkpoint was written: it starts over when resumed and its work so far is lost"
    if stop_requested_at is None or found.mtime >= stop_requested_at - 1.0:  # mtime granularity
        return f"checkpoint saved {_at(found)}"
    ago = stop_requested_at - found.mtime
    return (f"no checkpoint was written on the way out; it resumes from the checkpoint {_at(found)}, "
            f"saved {ago:.0f} s before the stop: the work since then is lost")
