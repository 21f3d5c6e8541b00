"""Graceful stop: SIGTERM (preemption, resize, cancel, ``deeppod stop``) sets a flag that
the training loop polls with :func:`should_stop`; the loop saves a checkpoint and exits
with :data:`EXIT_RESUME`, which tells DeepPod "preempted, resume me" rather than "failed".
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager

from deeppod.contract import EXIT_RESUME

_requested = threading.Event()
_reason: list[str] = []
_installed = False


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
    _requested.set()


def stop_reason() -> str | None:
    return _reason[0] if _reason else None


def should_stop(sync: bool = True) -> bool:
    """True once a stop was requested on this worker or, with ``sync``, on any worker.

    With ``sync`` (the default under ``torch.distributed``) all ranks agree in the same
    step, so none is left waiting in a collective; it costs one tiny all-reduce per call.
    """
    local = _requested.is_set()
    if not sync:
        return local
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return local
    import torch

    backend = dist.get_backend()
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    flag = torch.tensor([1 if local else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item() and not local:
        request_stop("another worker was asked to stop")
    return bool(flag.item())


def exit_for_resume() -> None:
    """Exit with :data:`EXIT_RESUME` after the checkpoint is on disk."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a peer may already be gone; we are exiting anyway
            pass
    sys.exit(EXIT_RESUME)


def loader_worker_init(worker_id: int = 0) -> None:
    """``worker_init_fn`` for data-loader worker processes: ignore SIGTERM.

    A stop is the training process's to handle: it finishes the step, checkpoints and exits,
    and its loader workers go with it. A launcher that signals the whole process group
    (torchrun does) would otherwise kill the workers first and the training process would
    die with "DataLoader worker is killed by signal: Terminated" before it could save.
    """
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
