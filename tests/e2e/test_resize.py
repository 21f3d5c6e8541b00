"""The built-in trainer resizes in place on the local executor: 2 -> 1 -> 3 workers without
a restart (the staying process keeps its model and loader; joiners, one from a warm spare
and one started cold by the job's supervisor, receive the model from rank 0), every sample
of every epoch seen exactly once."""

import json
import os
import sys
import time

import pytest

from deeppod.contract import (
    ENV_JOINING,
    ENV_WORLD_FILE,
    ENV_WORLD_GENERATION,
    JOINER_READY,
    RESIZABLE_MARK,
    SPARE_PARKED,
    WORLD_ACK,
    free_port,
    worker_env,
)
from deeppod.executor.base import LaunchSpec, WorkerSpec
from deeppod.executor.local import LocalExecutor
from deeppod.job_folder import JobFolder
from tests.e2e.datasets import digits_version
from tests.e2e.test_training import consumed, small_args, steps_done
from tests.helpers import wait_until

TRAINER = [sys.executable, "-m", "deeppod.runtime.trainers.image_classifier"]


@pytest.fixture(scope="module")
def version(tmp_path_factory):
    return digits_version(tmp_path_factory.mktemp("version"))


def spec(job_dir, rank, world, port, generation=0, joining=False):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEEPPOD_", "PYTEST_"))}
    env = worker_env(env, {}, job_id=0, rank=rank, world_size=world, local_rank=rank, local_world_size=world,
                     node_rank=0, master_addr="127.0.0.1", master_port=port, gpus=(), cpus=1,
                     checkpoint_dir=str(job_dir / "checkpoints"), api_url="", token="", restart_count=0)
    env.update({ENV_WORLD_FILE: str(JobFolder(job_dir).world_file), ENV_WORLD_GENERATION: str(generation)})
    if joining:
        env[ENV_JOINING] = "1"
    return WorkerSpec(rank, "n", env)


def resize(job_dir, generation, size):
    port = free_port()
    JobFolder(job_dir).write_world({"generation": generation, "world_size": size, "master_addr": "127.0.0.1",
                          "master_port": port, "decided_at": time.time()})
    return port


def acked(job_dir, generation):
    try:
        return json.loads((job_dir / "checkpoints" / WORLD_ACK).read_text())["generation"] >= generation
    except (OSError, ValueError):
        return False


def logs(job_dir) -> str:
    """Every rank's log, for a failure message: a resize that stalls says why only there."""
    return "".join(f"\n--- {p.name}\n{p.read_text()[-4000:]}" for p in sorted((job_dir / "logs").glob("*.log")))


def waiting(job_dir, pred, timeout, what):
    try:
        return wait_until(pred, timeout, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}{logs(job_dir)}") from None


@pytest.mark.timeout(900)
def test_the_trainer_shrinks_and_grows_in_place_and_sees_every_sample_once(tmp_path, version):
    ex, job_dir, records = LocalExecutor(), tmp_path / "job", tmp_path / "records"
    (job_dir / "checkpoints").mkdir(parents=True)
    records.mkdir()
    JobFolder(job_dir).reset_world()
    # three epochs: rank 0 alone must still be training while the spare parks and the joiners
    # start (torch imports take tens of seconds on a loaded machine); one epoch ran out first
    command = TRAINER + small_args(version, records, epochs=3, delay=0.15)
    port = free_port()
    h = ex.launch(LaunchSpec(job_id=0, job_dir=job_dir, command=command, workdir=str(job_dir),
                             workers=[spec(job_dir, r, 2, port) for r in range(2)], grace_seconds=20))
    wait_until(lambda: steps_done(records) >= 2 * 4, 180, what="a few steps on 2 workers")
    assert (job_dir / "checkpoints" / RESIZABLE_MARK).exists()

    resize(job_dir, 1, 1)  # shrink: rank 1 finishes its step and leaves, rank 0 goes on alone
    waiting(job_dir, lambda: acked(job_dir, 1), 120, "rank 0 to acknowledge 1 worker")
    status = wait_until(lambda: (st := ex.poll(h)).exit_codes and st, 60, what="rank 1 to leave")
    assert not status.finished and status.exit_codes == {1: 0}
    log = (job_dir / "logs" / "rank-0.log").read_text()
    assert "resized in place to 1 workers" in log and "resuming" not in log

    # grow: rank 1 from a warm spare (parked with torch imported), rank 2 started cold by the
    # supervisor; once both are ready, the world file says 3
    ex.keep_spares(h, 1)
    wait_until((job_dir / "checkpoints" / SPARE_PARKED.format(n=0)).exists, 120, what="the spare to park")
    port = free_port()
    ex.add_workers(h, [spec(job_dir, r, 3, port, generation=2, joining=True) for r in (1, 2)], 2)
    waiting(job_dir, lambda: all((job_dir / "checkpoints" / JOINER_READY.format(rank=r)).exists() for r in (1, 2)),
            180, "the joiners to be ready")
    JobFolder(job_dir).write_world({"generation": 2, "world_size": 3, "master_addr": "127.0.0.1", "master_port": port,
                          "decided_at": time.time()})
    waiting(job_dir, lambda: acked(job_dir, 2), 180, "rank 0 to acknowledge 3 workers")
    st = wait_until(lambda: (s := ex.poll(h)).finished and s, 300, what="the job to finish")
    log = (job_dir / "logs" / "rank-0.log").read_text()
    assert st.exit_codes == {0: 0, 1: 0, 2: 0}, log + (job_dir / "logs" / "rank-1.log").read_text()
    assert "resized in place to 3 workers" in log and "resuming" not in log
    assert "starts from warm spare 0" in (job_dir / "logs" / "rank-1.log").read_text()
    assert "warm spare" not in (job_dir / "logs" / "rank-2.log").read_text()
    n = int(log.split(" train / ")[0].split("; ")[-1])
    for epoch in range(3):  # the shrink lands in the first, the grow in whichever: each sample once in each
        seen = consumed(records, epoch)
        assert sorted(seen) == list(range(n)) and set(seen.values()) == {1}, f"epoch {epoch} over 2 -> 1 -> 3"
    assert (job_dir / "model" / "model.pt2").exists()
