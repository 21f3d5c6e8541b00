"""Graceful stop: SIGTERM (preemption, resize, cancel, ``deeppod stop``) sets a flag that
the training loop polls with :func:`should_stop`; the loop saves a checkpoint and exits
with :data:`EXIT_RESUME`, which tells DeepPod "preempted, resume me" rather than "failed".
"""

from __future__ import annotations

import atexit
import importlib
import io
import logging
import os
import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from deeppod.contract import ENV_CHECKPOINT_DIR, ENV_GRACE, EXIT_RESUME, JUDGEMENT_WAIT_S

_requested = threading.Event()
_reason: list[str] = []
_requested_at: list[float] = []  # time.monotonic() of the first request
_installed = False
_exit_hook = False


def install() -> None:
    """Catch SIGTERM (idempotent; main thread only, as Python requires)."""
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum, frame):  # noqa: ANN001
        request_stop("SIGTERM")
        if callable(previous) and previous not in (signal.SIG_DFL, signal.SIG_IGN):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, on_sigterm)
    _installed = True


def request_stop(reason: str = "requested") -> None:
    if not _requested.is_set():
        _reason.append(reason)
        _requested_at.append(time.monotonic())
    _requested.set()


def stop_reason() -> str | None:
    return _reason[0] if _reason else None


def should_stop(sync: bool = True) -> bool:
    """True once a stop was requested on this worker or, with ``sync``, on any worker.

    With ``sync`` (the default under ``torch.distributed``) all ranks agree in the same
    step, so none is left waiting in a collective; it costs one tiny all-reduce per call.
    In a search's trial, after a report at one of its pruner's rungs, it first waits for the
    answer to it, so a pruned trial stops at its rung.
    """
    _await_judgement()
    local = _requested.is_set()
    if not sync:
        return local
    agreed = agree(local)
    if agreed and not local:
        request_stop("another worker was asked to stop")
    return agreed


def _await_judgement() -> None:
    metrics = sys.modules.get("deeppod.runtime.metrics")  # loaded by the first report, if any
    reporter = getattr(metrics, "_default", None)
    if reporter is not None and reporter.trial is not None:
        reporter.await_judgement(JUDGEMENT_WAIT_S)


def agree(local: bool) -> bool:
    """True on every worker when it is true on any (one tiny all-reduce under
    ``torch.distributed``; the value itself in a single process)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return local
    import torch

    backend = dist.get_backend()
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    flag = torch.tensor([1 if local else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def exit_for_resume() -> NoReturn:
    """Exit with :data:`EXIT_RESUME` after the checkpoint is on disk (by :func:`exit_process`)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a peer may already be gone; we are exiting anyway
            pass
    _kill_children()
    exit_process(EXIT_RESUME)


def exit_process(code: int) -> NoReturn:
    """End this process with ``code`` without the interpreter's teardown, having done first what
    a normal exit does that a job can rely on: other non-daemon threads joined, ``atexit``
    handlers run (the job's own, multiprocessing's), every open file object flushed, logging
    shut down, standard streams flushed.

    Why not ``sys.exit``: at teardown CPython ends any other thread that asks for the GIL
    (``pthread_exit``). A native thread still inside a library then unwinds through C++ code
    that may not unwind (a ``noexcept`` destructor, such as pybind11's GIL release), and the
    process aborts: SIGABRT, "terminate called without an active exception". A gloo worker
    thread that lets go of a collective's tensors after the caller moved on, or any thread left
    in a torch operation, is such a thread, and on a loaded machine one is still there now and
    then; a stop then ended a rank with a crash. No thread is ended here: the process is.
    Objects are not finalized one by one (``__del__`` of what is still referenced does not run)."""
    main = threading.current_thread()
    for t in threading.enumerate():  # as the interpreter waits for them at exit
        if t is not main and not t.daemon and t.is_alive():
            t.join()
    try:
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 - a handler's failure is printed by atexit itself; exit anyway
        pass
    _flush_open_files()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(code)


def _flush_open_files() -> None:
    """Flush every open, writable file object (text ones first, then their buffers), as their
    finalization would have at a normal exit: what a job wrote and did not close is not lost."""
    import gc

    # type(), not isinstance(): that would read every object's __class__, which some libraries
    # turn into a property (torch.distributed.reduce_op warns when it is read)
    files = [f for f in gc.get_objects() if issubclass(type(f), io.IOBase)]
    for f in sorted(files, key=lambda f: not issubclass(type(f), io.TextIOBase)):
        try:
            if not f.closed and f.writable():
                f.flush()
        except Exception:  # noqa: BLE001 - a broken pipe, a detached buffer: nothing more to save there
            pass


def _kill_children(daemonic_only: bool = False) -> None:
    """SIGKILL what multiprocessing started (loader workers) before exiting: they ignore
    SIGTERM (:func:`loader_worker_init`), so one that outlived the loader's own shutdown would
    hold multiprocessing's exit-time join (SIGTERM, then join), and the process, until the
    grace's SIGKILL or for ever. The supervisor kills whatever the worker leaves behind anyway."""
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return
    for child in mp.active_children():
        if daemonic_only and not child.daemon:
            continue
        try:
            child.kill()
            child.join(1.0)
        except (OSError, ValueError, AssertionError):  # already gone, or not ours to join
            pass


def kill_daemonic_children_at_exit() -> None:
    """Once per process: at exit, SIGKILL the daemonic children multiprocessing would SIGTERM
    and then wait for (registered after multiprocessing's own hook, so it runs first)."""
    global _exit_hook
    if not _exit_hook:
        importlib.import_module("multiprocessing.util")  # its hook first, so that ours runs before it
        atexit.register(_kill_children, daemonic_only=True)
        _exit_hook = True


def grace_seconds() -> float:
    """The time between a stop's SIGTERM and its SIGKILL (DEEPPOD_GRACE_SECONDS; 30 s outside DeepPod)."""
    try:
        return max(0.0, float(os.environ.get(ENV_GRACE, "30")))
    except ValueError:
        return 30.0


def grace_left() -> float | None:
    """Seconds left before a requested stop's SIGKILL (None: no stop was requested). What a
    process does on its way out of a stop must fit in them, or it dies with -9 and its exit
    no longer says "resume me"."""
    if not _requested_at:
        return None
    return max(0.0, grace_seconds() - (time.monotonic() - _requested_at[0]))


class StopGuard:
    """Saves the last completed step when a stop finds the training loop busy for longer than
    it can wait: a step slower than the grace, an evaluation, a loader starting up.

    The loop changes its state (optimizer step, step counter, sampler) only inside ``with
    guard:``, so outside it the state is that of the last completed step. When a stop comes,
    the guard gives the loop ``budget`` seconds (40% of the grace) to reach its own stop path
    (which calls :meth:`handled` and saves); if it has not, the guard waits for the update in
    progress, if any, calls ``save`` itself (rank 0 writes; other ranks wait for that file)
    and the process exits with :data:`EXIT_RESUME`, well inside the grace. ``save=None``: no
    worker can save alone (a sharded model): it exits, and the job resumes from its last checkpoint.
    """

    def __init__(self, save, *, rank: int | None = None, grace: float | None = None,
                 checkpoint_dir: str | os.PathLike | None = None, before_exit=None):
        self._save, self._before_exit = save, before_exit
        self.rank = int(os.environ.get("RANK", 0)) if rank is None else rank
        self.grace = grace_seconds() if grace is None else grace
        self.budget = max(0.2, 0.4 * self.grace)
        folder = checkpoint_dir or os.environ.get(ENV_CHECKPOINT_DIR)
        self._folder = Path(folder) if folder else None
        self._lock = threading.RLock()
        self._handled = threading.Event()
        self._saving = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="deeppod-stop-guard", daemon=True)
        self._thread.start()

    def __enter__(self):
        self._lock.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()

    def handled(self) -> None:
        """The loop reached its own stop path: the guard stands down (call it inside ``with guard``)."""
        self._handled.set()

    def close(self) -> None:
        """The loop is done (or the guard is no longer wanted): a later stop is not its business."""
        self._handled.set()

    def settle(self) -> None:
        """Wait for a save the guard has begun (call on the way out, e.g. in ``finally``), so the
        loop's own failure (a peer gone) cannot end the process mid-write."""
        if self._saving.is_set():
            self._thread.join()

    def _watch(self) -> None:
        _requested.wait()
        stopped_at = time.time()
        if self._handled.wait(self.budget):
            return
        with self._lock:  # waits for an update in progress: the state is a completed step's
            if self._handled.is_set():
                return
            self._handled.set()
            self._saving.set()
            if self._save is not None:
                print(f"the stop found the loop busy for {self.budget:.1f} s: saving the last completed step "
                      f"instead of waiting for it", file=sys.stderr, flush=True)
            code = EXIT_RESUME
            try:
                if self._save is None:  # nothing one worker can save alone (a sharded model)
                    print(f"the stop found the loop busy for {self.budget:.1f} s, and a sharded model needs every "
                          "worker to save: the job resumes from its last checkpoint",
                          file=sys.stderr, flush=True)
                elif self.rank == 0:
                    self._save()
                else:
                    self._wait_for_save(stopped_at)
                if self._before_exit is not None:
                    self._before_exit()
            except BaseException:  # noqa: BLE001 - say why, and end as a failure to save
                traceback.print_exc()
                code = 1
            sys.stderr.flush()
            sys.stdout.flush()
            os._exit(code)  # the main thread is inside a step: it cannot be asked to return

    def _wait_for_save(self, since: float) -> None:
        """Another rank: until rank 0's checkpoint after the stop is on disk (or the grace ends)."""
        deadline = since + self.grace
        while self._folder is not None and time.time() < deadline:
            try:
                if any(e.stat().st_mtime >= since - 1.0 for e in os.scandir(self._folder)
                       if not e.name.startswith(".") and not e.name.endswith(".tmp")):
                    return
            except OSError:
                pass
            time.sleep(0.1)


def loader_worker_init(worker_id: int = 0) -> None:
    """A loader worker ignores SIGTERM: a stop is the training process's, which saves first."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


@contextmanager
def holding_sigterm():
    """Hold SIGTERM back while loader workers are forked: a child inherits the blocked mask,
    so none can die of a SIGTERM before :func:`loader_worker_init` ignores it. A SIGTERM that
    arrives meanwhile reaches this process as soon as the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _reset_for_tests() -> None:
    _requested.clear()
    _reason.clear()
    _requested_at.clear()
