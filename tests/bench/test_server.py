"""The benchmarks' server harness ends what its server's jobs left running."""

import json
import os
import sys

import pytest

from deeppod.bench.server import Server
from deeppod.executor.base import LaunchSpec, WorkerSpec
from deeppod.executor.local import LocalExecutor, process_start_time
from tests.helpers import wait_until

pytestmark = pytest.mark.slow  # its tests start processes (tests/conftest.py)


def test_end_jobs_stops_the_jobs_that_outlive_the_server(tmp_path):
    home = tmp_path / "home"
    ex = LocalExecutor()
    env = {"PATH": os.environ["PATH"]}
    running = ex.launch(LaunchSpec(job_id=1, job_dir=home / "jobs" / "1", command=[sys.executable, "-c",
                                   "import time; time.sleep(600)"], workdir=str(tmp_path),
                                   workers=[WorkerSpec(0, "n", env)], grace_seconds=2))
    done = ex.launch(LaunchSpec(job_id=2, job_dir=home / "jobs" / "2", command=[sys.executable, "-c", "pass"],
                                workdir=str(tmp_path), workers=[WorkerSpec(0, "n", env)], grace_seconds=2))
    wait_until(lambda: ex.poll(done).finished, 30, what="the short job to end")
    wait_until(lambda: (home / "jobs/1/workers.json").exists(), 30, what="the long job's worker")
    worker = json.loads((home / "jobs/1/workers.json").read_text())["0"]

    assert Server(home).end_jobs() == 1  # the one still running, not the finished one
    st = ex.poll(running)
    assert st.finished and st.stopped
    assert process_start_time(worker) is None  # its worker is gone too
    assert Server(home).end_jobs() == 0
