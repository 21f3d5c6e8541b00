"""Checkpoints that survive preemption and resize.

Atomic (temp file, fsync, rename, fsync of the folder), the last ``keep`` kept, written
by rank 0 only, optionally in a background thread so the loop does not wait on disk
(tensors are copied to host memory first, so training may go on changing them).

A sharded model (``runtime.shard``) is saved by every worker at once, each its own shards,
with ``torch.distributed.checkpoint`` into a folder ``ckpt-<step>.dcp`` (renamed into place
by rank 0 once all have written; in the background too: each worker copies its shards to
host memory and goes on); it loads at any number of workers, into a sharded model or a whole
one. A single-file checkpoint loads into a sharded model too.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deeppod.atomic import atomic_file, fsync_dir
from deeppod.contract import ENV_CHECKPOINT_DIR
from deeppod.runtime.rng import rng_state, set_rng_state

log = logging.getLogger(__name__)
_NAME = re.compile(r"^ckpt-(\d{12})\.(?:pt|dcp)$")


def step_of(name: str) -> int | None:
    """The step a checkpoint file name records (``ckpt-000000000120.pt`` -> 120), else None."""
    m = _NAME.match(name)
    return int(m.group(1)) if m else None


def _unwrap(model):
    return getattr(model, "module", model)  # DDP / DataParallel


def _to_cpu(obj):
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


class Checkpointer:
    def __init__(self, directory: str | os.PathLike | None = None, *, keep: int = 3, background: bool = False,
                 rank: int | None = None):
        if directory is None:
            directory = os.environ.get(ENV_CHECKPOINT_DIR) or "checkpoints"
        self.dir = Path(directory)
        self.keep = max(1, keep)
        self.background = background
        self.rank = int(os.environ.get("RANK", 0)) if rank is None else rank
        self._thread: threading.Thread | None = None
        self._pending: Callable[[], object] | None = None  # a background sharded save's end, run by wait()
        self.dcp_group = None  # background sharded saves' own gloo group (made at the first one)
        self._error: BaseException | None = None
        self.last_save_seconds = 0.0
        if self.rank == 0:
            self.dir.mkdir(parents=True, exist_ok=True)

    # -- saving --------------------------------------------------------------------
    def save(self, step: int, *, model=None, optimizer=None, scheduler=None, scaler=None, epoch: int = 0,
             sampler=None, extra: dict | None = None, blocking: bool | None = None) -> Path | None:
        """Save everything needed to resume exactly here. Returns the path (rank 0) or None.
        A sharded model: every worker must call it (each saves its shards)."""
        from deeppod.runtime.sharding import is_sharded

        if model is not None and is_sharded(_unwrap(model)):
            from deeppod.runtime import _sharded_checkpoint

            return _sharded_checkpoint.save(self, step, model=_unwrap(model), optimizer=optimizer, rest={
                "scheduler": scheduler, "scaler": scaler, "sampler": sampler}, epoch=epoch, extra=extra,
                background=self.background if blocking is None else not blocking)
        if self.rank != 0:
            return None
        import time

        began = time.perf_counter()
        self.wait()
        state: dict[str, Any] = {"step": step, "epoch": epoch, "rng": rng_state(), "extra": extra or {}}
        if model is not None:
            state["model"] = _unwrap(model).state_dict()
        for key, obj in (("optimizer", optimizer), ("scheduler", scheduler), ("scaler", scaler), ("sampler", sampler)):
            if obj is not None:
                state[key] = obj.state_dict()
        path = self.dir / f"ckpt-{step:012d}.pt"
        if self.background if blocking is None else not blocking:
            state = _to_cpu(state)  # a private copy: training may go on
            self._thread = threading.Thread(target=self._write_guarded, args=(state, path), daemon=True)
            self._thread.start()
        else:
            self._write(state, path)
        self.last_save_seconds = time.perf_counter() - began
        return path

    def _write_guarded(self, state: dict, path: Path) -> None:
        try:
            self._write(state, path)
        except BaseException as exc:  # noqa: BLE001 - surfaced by wait()
            self._error = exc

    def _write(self, state: dict, path: Path) -> None:
        import torch

        with atomic_file(path, mode=0o644, fsync=True) as f:
            torch.save(state, f)
        fsync_dir(self.dir)  # the rename itself is durable
        self.prune()
        log.debug("checkpoint %s written", path)

    def prune(self) -> None:
        for old in self.checkpoints()[:-self.keep]:
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)

    def pending(self, finish: Callable[[], object]) -> None:
        """A background sharded save in flight: ``finish`` waits for it and puts it in place."""
        self._pending = finish

    def wait(self) -> None:
        """Block until a background save has finished; re-raise its error if it failed. With a
        sharded model every worker calls it (the trainer does before it exits)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._pending is not None:
            finish, self._pending = self._pending, None
            try:
                finish()
            except Exception as exc:  # noqa: BLE001 - raised as the single-file path raises
                self._error = exc
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"background checkpoint failed: {err}") from err

    # -- loading -------------------------------------------------------------------
    def checkpoints(self) -> list[Path]:
        if not self.dir.is_dir():
            return []
        return sorted((p for p in self.dir.iterdir() if _NAME.match(p.name)), key=lambda p: step_of(p.name))

    def load_latest(self, *, model=None, optimizer=None, scheduler=None, scaler=None, sampler=None,
                    map_location="cpu", restore_rng: bool = True) -> dict | None:
        """Restore the newest readable checkpoint into the given objects; None if there is none.
        A truncated file (a crash mid-write cannot leave one, but a full disk can) is skipped."""
        import torch

        from deeppod.runtime import _sharded_checkpoint
        from deeppod.runtime.sharding import is_sharded

        sharded = model is not None and is_sharded(_unwrap(model))
        for path in reversed(self.checkpoints()):
            try:
                state = _sharded_checkpoint.meta(path) if path.is_dir() else \
                    torch.load(path, map_location=map_location, weights_only=False)
            except Exception as exc:  # noqa: BLE001 - try the previous one
                log.warning("skipping unreadable checkpoint %s: %s", path, exc)
                continue
            if path.is_dir():  # a model that does not fit it fails here, as with a single file
                _sharded_checkpoint.load_into(path, _unwrap(model) if model is not None else None, optimizer)
            elif sharded:
                _sharded_checkpoint.load_whole(state, _unwrap(model), optimizer)
            else:
                if model is not None and "model" in state:
                    _unwrap(model).load_state_dict(state["model"])
                if optimizer is not None and "optimizer" in state:
                    optimizer.load_state_dict(state["optimizer"])
            for key, obj in (("scheduler", scheduler), ("scaler", scaler), ("sampler", sampler)):
                if obj is not None and key in state:
                    obj.load_state_dict(state[key])
            if restore_rng and "rng" in state:
                set_rng_state(state["rng"])
            state["path"] = str(path)
            return state
        return None
