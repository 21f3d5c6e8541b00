"""The built-in trainer, two real gloo workers: a stop that reaches one worker before the
other (a supervisor signals them one by one; a node's signal can come late) still ends with
every worker saving the same step and exiting for a resume, none crashing in a collective
its peer never joined."""

import os
import signal
import subprocess
import sys
import time

import pytest

from deeppod.contract import ENV_CHECKPOINT_DIR, EXIT_RESUME, free_port
from deeppod.runtime.trainers.digits import write_digits

pytestmark = pytest.mark.slow  # its tests start processes (tests/conftest.py)


def start(tmp, rank, port, data):
    env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), ENV_CHECKPOINT_DIR: str(tmp / "checkpoints"), "OMP_NUM_THREADS": "1"}
    # the defaults a user gets (loader workers among them), small enough for a CPU
    args = ["--data", str(data), "--model", "small-cnn", "--image-size", "16", "--epochs", "2", "--batch-size", "32",
            "--step-delay", "0.2", "--record-samples", str(tmp / "steps"), "--output", str(tmp / "model")]
    return subprocess.Popen([sys.executable, "-m", "deeppod.runtime.trainers.image_classifier", *args], env=env,
                            stdout=open(tmp / f"log-{rank}.txt", "w"), stderr=subprocess.STDOUT)


def steps(tmp, rank) -> int:
    path = tmp / "steps" / f"run0-rank{rank}.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_stop_that_reaches_one_worker_first_saves_on_both(tmp_path):
    data = write_digits(tmp_path / "digits")
    (tmp_path / "steps").mkdir()
    port = free_port()
    procs = [start(tmp_path, r, port, data) for r in range(2)]
    try:
        deadline = time.monotonic() + 120
        while steps(tmp_path, 1) < 3:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
                (tmp_path / "log-0.txt").read_text()[-2000:]
            time.sleep(0.05)
        procs[1].send_signal(signal.SIGTERM)  # rank 1 alone: rank 0 hears of it from rank 1
        codes = [p.wait(60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    logs = [(tmp_path / f"log-{r}.txt").read_text() for r in range(2)]
    assert codes == [EXIT_RESUME, EXIT_RESUME], (codes, logs[0][-2000:], logs[1][-2000:])
    assert "stopping at epoch 1 step " in logs[0] and "checkpoint saved" in logs[0], logs[0][-2000:]
    assert "Traceback" not in logs[0] + logs[1], logs
    assert "saving the last completed step" not in logs[1]  # the loop's own stop path, not the guard's
    assert steps(tmp_path, 0) == steps(tmp_path, 1)  # both stopped after the same step
