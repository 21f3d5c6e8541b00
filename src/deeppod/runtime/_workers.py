"""Where loader worker processes come from (see ``data.worker_context``): multiprocessing's
fork server, whose server process is, when it can be, a fork of this process made while it
is still single-threaded, instead of a new interpreter.

A new interpreter (multiprocessing's own way) must import torch again before it forks the
first worker: about 2 s of CPU per training process on a small machine, paid at every job
start and restart. A fork taken before ``runtime.init()`` has torch already and no thread that
enters Python, so nothing can hold an interpreter lock in it. Once such threads may run
(gloo's, after init), the server is spawned as multiprocessing does, with the preload list."""

from __future__ import annotations

import os
import signal
import socket
import sys


def _safe_to_fork() -> bool:
    """No thread that may enter Python runs yet: no other Python thread, no process group
    (gloo's threads) and no CUDA context. Native pools that never call into Python (OpenBLAS's
    server thread, which importing numpy starts; OpenMP's) cannot hold its locks."""
    import threading

    if threading.active_count() > 1:
        return False
    torch = sys.modules.get("torch")
    if torch is None:
        return True
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return False
    return not torch.cuda.is_initialized()


def ensure_running() -> None:
    """Start this process's fork server if it is not running."""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if server._forkserver_pid is None and _safe_to_fork():
        _fork_server(server)
    forkserver.ensure_running()  # keeps ours if it is alive; else spawns one


def _fork_server(server) -> None:
    from multiprocessing import connection, forkserver, resource_tracker, util

    with server._lock:
        resource_tracker.ensure_running()  # before the fork: the server and its workers share it
        address = connection.arbitrary_address("AF_UNIX")
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(address)
        if not util.is_abstract_socket_namespace(address):
            os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()  # EOF on alive_r: this process is gone, so is the server
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the server: never returns
            code = 0
            try:
                os.close(alive_w)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as _loader_server does for a spawned one
                forkserver.main(listener.detach(), alive_r, [])
            except SystemExit:
                pass
            except BaseException:  # noqa: BLE001 - say why, then go: the client sees the server gone
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)  # not the training process's atexit handlers
        listener.close()
        os.close(alive_r)
        server._forkserver_address = address
        server._forkserver_alive_fd = alive_w
        server._forkserver_pid = pid
