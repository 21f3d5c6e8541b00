"""A warm spare: a worker started before an in-place grow needs it.

A grow in place cannot beat a restart while its new workers start cold: starting Python and
importing torch (seconds) is what both pay. So while a resizable job runs below its
largest size, the supervisor keeps a few spare processes of it: each runs the job's
command and parks in :func:`deeppod.runtime.init` once torch is imported, before it
touches a GPU or reads its rank. When a grow comes, the supervisor hands a spare the place
of a new worker: the worker's environment and its log file, over the spare's stdin, a Unix
socket. The spare takes them on and ``init()`` goes on as that joiner's would.

What a script runs before ``runtime.init()`` runs in a spare too, with no rank: it must not
depend on the rank or touch CUDA there (a spare sees no GPU until it is handed one).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from deeppod.contract import ENV_CHECKPOINT_DIR, ENV_SPARE, SPARE_PARKED

_MAX_ASSIGNMENT = 1 << 20
PARKED = b"parked\n"


def is_spare() -> bool:
    return bool(os.environ.get(ENV_SPARE))


def await_assignment() -> None:
    """Park until the supervisor hands this process a worker's place, then become that
    worker: its environment, its log file on stdout and stderr. When the supervisor closes
    the socket instead (the job no longer needs the spare, or it ended), exit quietly."""
    mark = _parked_mark()
    sock = socket.socket(fileno=os.dup(0))
    data, fds = b"", []
    try:
        while not data.endswith(b"\n"):
            if len(data) > _MAX_ASSIGNMENT:
                raise RuntimeError("deeppod spare: the supervisor's assignment is too long")
            try:
                if not data and not fds:
                    sock.sendall(PARKED)  # the supervisor hands a worker's place only to a spare that said so
                chunk, got, _flags, _addr = socket.recv_fds(sock, 65536, 2)
            except OSError:  # the supervisor closed its end (unread, "parked" makes that a reset)
                chunk, got = b"", []
            fds += got
            if not chunk:
                _remove(mark)
                sys.stdout.flush()
                os._exit(0)  # not needed: nothing of the job's ran after the park
            data += chunk
    finally:
        sock.close()
    env = json.loads(data)
    if not isinstance(env, dict):
        raise RuntimeError("deeppod spare: the supervisor's assignment is not an environment")
    _remove(mark)
    sys.stdout.flush()
    sys.stderr.flush()
    if fds:  # from now on this process writes to its rank's log
        os.dup2(fds[0], 1)
        os.dup2(fds[0], 2)
    for fd in fds:
        os.close(fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the socket is done with: stdin is what a worker's is
    os.close(devnull)
    os.environ.pop(ENV_SPARE, None)
    os.environ.update({str(k): str(v) for k, v in env.items()})


def _parked_mark() -> Path | None:
    """Tells the control plane (and the tests) that spare N waits with its imports done."""
    folder = os.environ.get(ENV_CHECKPOINT_DIR)
    if not folder:
        return None
    mark = Path(folder) / SPARE_PARKED.format(n=os.environ.get(ENV_SPARE))
    try:
        mark.write_text(str(os.getpid()))
    except OSError:
        return None
    return mark


def _remove(mark: Path | None) -> None:
    if mark is not None:
        mark.unlink(missing_ok=True)
