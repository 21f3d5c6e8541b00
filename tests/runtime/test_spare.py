"""A warm spare parks in runtime.init() with torch imported, then becomes the worker the
supervisor hands it: that worker's environment and log file, over a Unix socket on stdin."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from deeppod.contract import ENV_CHECKPOINT_DIR, ENV_SPARE, SPARE_PARKED
from tests.helpers import wait_until

pytestmark = pytest.mark.slow  # its tests start processes (tests/conftest.py)

SCRIPT = textwrap.dedent("""
    import os, sys
    print("before init", flush=True)   # runs in the spare, into its own log
    from deeppod import runtime
    ctx = runtime.init()
    import torch
    print("rank", ctx.rank, "of", ctx.world_size, os.environ.get("ONLY_THE_WORKER"),
          os.environ.get("DEEPPOD_SPARE"), "torch" in sys.modules, sys.stdin.read() == "",
          torch.get_num_threads(), flush=True)
""")


def start_spare(tmp_path):
    (tmp_path / "w.py").write_text(SCRIPT)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    ours, theirs = socket.socketpair()
    spare_log = open(tmp_path / "spare.log", "wb")
    env = {"PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1", ENV_SPARE: "0", ENV_CHECKPOINT_DIR: str(ckpt),
           "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "2"}
    p = subprocess.Popen([sys.executable, "w.py"], cwd=tmp_path, env=env, stdin=theirs, stdout=spare_log,
                         stderr=subprocess.STDOUT)
    theirs.close()
    spare_log.close()
    mark = ckpt / SPARE_PARKED.format(n=0)
    wait_until(mark.exists, 60, what="the spare to park")
    assert mark.read_text() == str(p.pid)
    return p, ours, mark


def test_a_parked_spare_becomes_the_worker_it_is_handed(tmp_path):
    p, sock, mark = start_spare(tmp_path)
    assert p.poll() is None  # parked: waiting, not running the job
    worker_env = {"PATH": os.environ["PATH"], "RANK": "3", "WORLD_SIZE": "1", "ONLY_THE_WORKER": "yes",
                  "OMP_NUM_THREADS": "1"}
    with open(tmp_path / "rank-3.log", "ab") as log:
        socket.send_fds(sock, [json.dumps(worker_env).encode() + b"\n"], [log.fileno()])
    sock.close()
    assert p.wait(60) == 0
    assert (tmp_path / "spare.log").read_text() == "before init\n"
    # its rank, its env, torch imported before the park, stdin no longer the socket, the
    # worker's CPU request (not the spare's); the spare's mark gone
    assert (tmp_path / "rank-3.log").read_text() == "rank 3 of 1 yes None True True 1\n"
    assert not mark.exists()


def test_a_spare_no_longer_needed_exits_quietly_when_the_socket_closes(tmp_path):
    p, sock, mark = start_spare(tmp_path)
    sock.close()
    assert p.wait(60) == 0
    assert (tmp_path / "spare.log").read_text() == "before init\n"  # nothing after the park ran
    assert not mark.exists()
