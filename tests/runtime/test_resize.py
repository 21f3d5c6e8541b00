"""In-place resize with real processes (gloo): the workers that stay keep their processes,
every sample of the epoch is seen exactly once across the sizes, joiners get rank 0's model,
and a switch that cannot complete falls back to a checkpoint (exit 75)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deeppod.contract import (
    ENV_CHECKPOINT_DIR,
    ENV_JOINING,
    ENV_RESIZE_TIMEOUT,
    ENV_WORLD_FILE,
    ENV_WORLD_GENERATION,
    EXIT_RESUME,
    JOINER_READY,
    RESIZABLE_MARK,
    WORLD_ACK,
    free_port,
)

pytestmark = pytest.mark.slow  # its tests start processes (tests/conftest.py)

JOB = Path(__file__).with_name("resize_job.py")
N, BATCH = 96, 2


def start(tmp, rank, world, port, generation=0, joining=False, **extra):
    env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), ENV_WORLD_FILE: str(tmp / "world" / "world.json"),
           ENV_WORLD_GENERATION: str(generation), ENV_CHECKPOINT_DIR: str(tmp / "checkpoints"),
           "OMP_NUM_THREADS": "1", **extra}
    if joining:
        env[ENV_JOINING] = "1"
    return subprocess.Popen([sys.executable, str(JOB), str(tmp / "out"), str(N), str(BATCH)], env=env,
                            stdout=open(tmp / f"log-{rank}-{generation}.txt", "w"), stderr=subprocess.STDOUT)


def world(tmp, generation, size, port):
    (tmp / "world").mkdir(exist_ok=True)
    tmp_file = tmp / "world" / ".w"
    tmp_file.write_text(json.dumps({"generation": generation, "world_size": size, "master_addr": "127.0.0.1",
                                    "master_port": port, "decided_at": time.time()}))
    os.replace(tmp_file, tmp / "world" / "world.json")


def lines(tmp, rank):
    path = tmp / "out" / f"rank-{rank}.txt"
    return path.read_text().splitlines() if path.exists() else []


def wait_steps(tmp, rank, steps, timeout=60):
    deadline = time.time() + timeout
    while len(lines(tmp, rank)) < steps:
        assert time.time() < deadline, f"rank {rank} made {len(lines(tmp, rank))} steps"
        time.sleep(0.05)


def seen_once(tmp, ranks):
    samples = [int(x) for r in ranks for line in lines(tmp, r) if line != "done" for x in line.split()[3:]]
    assert sorted(samples) == list(range(N)), "every sample of the epoch once, none twice"


def by_step(tmp, rank):
    return {int(f[0]): (int(f[1]), f[2]) for f in (line.split() for line in lines(tmp, rank)) if f[0] != "done"}


@pytest.fixture
def tmp(tmp_path):
    (tmp_path / "out").mkdir()
    return tmp_path


def test_shrink_in_place_keeps_the_staying_process_and_sees_every_sample_once(tmp):
    port = free_port()
    procs = [start(tmp, r, 2, port) for r in range(2)]
    wait_steps(tmp, 0, 5)
    assert (tmp / "checkpoints" / RESIZABLE_MARK).exists()
    world(tmp, 1, 1, free_port())
    assert procs[1].wait(60) == 0  # the leaving worker finishes its step and exits cleanly
    assert procs[0].wait(60) == 0
    seen_once(tmp, [0, 1])
    steps = by_step(tmp, 0)
    assert {size for size, _ in steps.values()} == {1, 2} and lines(tmp, 0)[-1] == "done"
    ack = json.loads((tmp / "checkpoints" / WORLD_ACK).read_text())
    assert ack["generation"] == 1 and ack["world_size"] == 1 and ack["from"] == 2 and ack["at"] >= ack["decided_at"]


def test_grow_in_place_joiners_get_rank_zeros_model_and_the_epoch_goes_on(tmp):
    first = start(tmp, 0, 1, free_port(), STEP_SLEEP="0.4")  # the epoch outlasts the joiner's start
    wait_steps(tmp, 0, 3)
    port = free_port()
    joiner = start(tmp, 1, 2, port, generation=1, joining=True)  # it builds its model, says so, and waits
    ready = tmp / "checkpoints" / JOINER_READY.format(rank=1)
    deadline = time.time() + 60
    while not ready.exists():
        assert time.time() < deadline and joiner.poll() is None, "the joiner never said it was ready"
        time.sleep(0.05)
    before = len(lines(tmp, 0))
    wait_steps(tmp, 0, before + 1, timeout=20)  # rank 0 trains on while the joiner waits
    world(tmp, 1, 2, port)
    assert first.wait(60) == 0 and joiner.wait(60) == 0
    seen_once(tmp, [0, 1])
    zero, one = by_step(tmp, 0), by_step(tmp, 1)
    shared = sorted(set(zero) & set(one))
    assert shared and min(shared) > 3, "the joiner went on from rank 0's step count"
    assert all(zero[s] == one[s] for s in shared), "the same weights on both ranks at every step after the join"
    assert {size for size, _ in zero.values()} == {1, 2}


def test_a_joiner_that_dies_before_joining_falls_back_to_a_checkpoint(tmp):
    first = start(tmp, 0, 1, free_port(), **{ENV_RESIZE_TIMEOUT: "3"})
    wait_steps(tmp, 0, 3)
    world(tmp, 1, 2, free_port())  # rank 1 said it was ready, then died: nobody comes
    assert first.wait(60) == EXIT_RESUME
    saved = sorted((tmp / "checkpoints").glob("ckpt-*.pt"))
    assert saved, "rank 0 saved its in-memory state before exiting for a restart"
    # the restart at the new size resumes from it and finishes the epoch, exactly once
    port = free_port()
    again = [start(tmp, r, 2, port, generation=2) for r in range(2)]
    codes = [p.wait(60) for p in again]
    assert codes == [0, 0], "\n".join((tmp / f"log-{r}-2.txt").read_text()[-3000:] for r in range(2))
    seen_once(tmp, [0, 1])
