"""The built-in trainer with --strategy fsdp, two and three real gloo workers with its default
loader workers: the same weights as DDP (an epoch whose last step only one worker has data
for included), and a stop at 2 workers that resumes at 3 from the sharded checkpoint with
every sample of the epoch seen once."""

import os
import signal
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image

from deeppod.contract import ENV_CHECKPOINT_DIR, ENV_RESTART_COUNT, EXIT_RESUME, free_port
from deeppod.runtime.trainers.image_classifier import scan, split

pytestmark = pytest.mark.slow  # its tests start processes (tests/conftest.py)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """3 classes of 16-px images; 69 of them train (the split is by file name)."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for c in range(3):
        (root / f"c{c}").mkdir()
        for i in range(30):
            Image.fromarray((rng.random((16, 16,
                                         3)) * 80 + c * 60).astype("uint8")).save(root / f"c{c}" / f"{c}_{i}.png")
    assert len(split(scan(root)[1], 0.22)[0]) == 69
    return root


def run(tmp, images, world, *args, tag="run", restart=0):
    port = free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), ENV_CHECKPOINT_DIR: str(tmp / "checkpoints"),
               ENV_RESTART_COUNT: str(restart), "OMP_NUM_THREADS": "1"}
        command = [sys.executable, "-m", "deeppod.runtime.trainers.image_classifier", "--data", str(images),
                   "--model", "small-cnn", "--image-size", "16", "--val-fraction", "0.22", "--lr", "0.05",
                   "--output", str(tmp / "model"), *args]
        procs.append(subprocess.Popen(command, env=env, stdout=open(tmp / f"{tag}-{rank}.txt", "w"),
                                      stderr=subprocess.STDOUT))
    return procs


def finish(tmp, procs, tag="run"):
    codes = [p.wait(240) for p in procs]
    return codes, [(tmp / f"{tag}-{r}.txt").read_text() for r in range(len(procs))]


def test_sharded_training_gives_ddps_weights_even_when_one_worker_runs_out_first(tmp_path, images):
    """69 samples at 17 per worker: rank 0 takes 3 steps, rank 1 has data for 2 and stands in
    for the third with an empty one (DDP's join() does that for DDP)."""
    weights = {}
    for strategy in ("ddp", "fsdp"):
        tmp = tmp_path / strategy
        tmp.mkdir()
        codes, logs = finish(tmp, run(tmp, images, 2, "--strategy", strategy, "--epochs", "1", "--batch-size", "34"))
        assert codes == [0, 0], logs
        weights[strategy] = torch.load(tmp / "model" / "weights.pt")
        saved = [p.name for p in (tmp / "checkpoints").iterdir() if p.name.startswith("ckpt-")]
        assert saved == ["ckpt-000000000003" + (".dcp" if strategy == "fsdp" else ".pt")], saved
        assert (tmp / "model" / "model.pt2").exists()
    ddp, fsdp = weights["ddp"], weights["fsdp"]
    assert ddp.keys() == fsdp.keys()
    for name in ddp:  # batch norm's running statistics are each worker's own (DDP's come from its last joiner)
        if "running_" not in name and "num_batches" not in name:
            torch.testing.assert_close(fsdp[name], ddp[name], rtol=1e-5, atol=1e-6, msg=name)


def seen(records, epoch=0, upto=None) -> Counter:
    c = Counter()
    for f in records.glob("run*-rank*.txt"):
        run_no = int(f.name.split("-")[0][3:])
        for line in f.open():
            e, step, *idx = line.split()
            if int(e) == epoch and (upto is None or int(step) <= upto.get(run_no, 1 << 30)):
                c.update(int(i) for i in idx)
    return c


def test_a_sharded_job_stopped_at_two_workers_resumes_at_three(tmp_path, images):
    records = tmp_path / "records"
    records.mkdir()
    slow = ["--strategy", "fsdp", "--epochs", "1", "--batch-size", "4", "--step-delay", "0.1",
            "--record-samples", str(records)]
    procs = run(tmp_path, images, 2, *slow, tag="first")
    deadline = time.monotonic() + 120
    while sum(1 for f in records.glob("run0-*.txt") for _ in f.open()) < 8:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
            (tmp_path / "first-0.txt").read_text()[-3000:]
        time.sleep(0.05)
    for p in procs:
        p.send_signal(signal.SIGTERM)
    codes, logs = finish(tmp_path, procs, "first")
    assert codes == [EXIT_RESUME, EXIT_RESUME], logs
    stopped = int(logs[0].split("stopping at epoch 1 step ")[1].split()[0])
    assert [p.name for p in (tmp_path / "checkpoints").glob("ckpt-*")] == [f"ckpt-{stopped:012d}.dcp"]

    codes, logs = finish(tmp_path, run(tmp_path, images, 3, *slow, tag="again", restart=1), "again")
    assert codes == [0, 0, 0], logs
    assert f"resuming at epoch 1 step {stopped}" in logs[0] and "world 3 (base 2)" in logs[0], logs[0]
    epoch = seen(records, upto={0: stopped})
    assert set(epoch.values()) == {1} and len(epoch) == 69, "every sample of the epoch once, across the two sizes"
    assert (tmp_path / "model" / "model.pt2").exists()


def test_a_one_worker_sharded_run_resumes_at_two(tmp_path, images):
    """One worker shards too (offload to host memory is why a one-GPU job would): its sharded
    checkpoint is one of the world of 1, and two workers take it up."""
    args = ["--strategy", "fsdp", "--batch-size", "34"]
    codes, logs = finish(tmp_path, run(tmp_path, images, 1, *args, "--epochs", "1", tag="one"), "one")
    assert codes == [0], logs
    assert [p.name for p in (tmp_path / "checkpoints").glob("ckpt-*")] == ["ckpt-000000000003.dcp"]
    codes, logs = finish(tmp_path, run(tmp_path, images, 2, *args, "--epochs", "2", tag="two", restart=1), "two")
    assert codes == [0, 0], logs
    assert "resuming at epoch 2 step 3" in logs[0] and "world 2 (base 1)" in logs[0], logs[0]
    assert "epoch 2/2: loss" in logs[0] and (tmp_path / "model" / "model.pt2").exists()
