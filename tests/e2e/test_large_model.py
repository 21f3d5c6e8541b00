"""A model larger than one worker's memory, as a user trains it: ``deeppod train --memory``
on the server a user gets (sandboxed as root, the kernel holding each worker to its memory).
ResNet-101 with Adam needs about 1.7 GiB per worker whole; at 1,200 MiB the CLI shards it
over two workers and it trains; DDP is refused at submit with the estimate, and a DDP job
submitted past the CLI is stopped by the kernel, so the refusal was right."""

import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from deeppod import Client
from deeppod.runtime.trainers.command import image_classifier
from tests.helpers import LiveServer

pytestmark = pytest.mark.slow

MEMORY = "1200M"
TRAIN = ["--model", "resnet101", "--image-size", "32", "--batch-size", "16", "--optimizer", "adam", "--lr", "0.01",
         "--epochs", "1", "--max-steps", "2"]  # two steps show the memory; the end gathers the model for its artifact


@pytest.fixture
def server(tmp_path):
    s = LiveServer(tmp_path / "home", isolation=None).start()
    try:
        if Client(s.url, s.admin_token).whoami()["isolation"] != "sandbox" or \
                "not enforced by the kernel" in s.output.read_text():
            pytest.skip("needs a root server with usable cgroups")
        yield s
    finally:
        s.stop()
        s.cleanup_jobs()


def cli(server, tmp_path, *args, check=True):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPPOD_")}
    env.update({"DEEPPOD_API_URL": server.url, "DEEPPOD_TOKEN": server.admin_token,
                "DEEPPOD_CONFIG": str(tmp_path / "c.json"), "COLUMNS": "250"})
    p = subprocess.run([sys.executable, "-m", "deeppod.cli", *args], env=env, capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert not check or p.returncode == 0, p.stdout + p.stderr
    return p


def images(root):
    rng = np.random.default_rng(0)
    for c in range(3):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(30):
            Image.fromarray((rng.random((16, 16, 3)) * 80 + c * 60).astype("uint8")).save(root / f"c{c}" / f"{i}.png")
    return root


@pytest.mark.timeout(600)
def test_a_model_larger_than_a_worker_trains_sharded_and_ddp_is_refused(server, tmp_path):
    cli(server, tmp_path, "data", "ingest", "shapes", str(images(tmp_path / "shapes")), "--split", "val=0.2")
    base = ["train", "image-classifier", "--dataset", "shapes", *TRAIN, "-n", "2", "--memory", MEMORY]

    refused = cli(server, tmp_path, *base, "--strategy", "ddp", check=False)
    assert refused.returncode == 2 and "resnet101 does not fit in 1,200 MiB per worker" in refused.stderr, refused.stderr
    assert "ddp at 2 workers" in refused.stderr and "optimizer" in refused.stderr

    out = cli(server, tmp_path, *base).stdout
    assert "memory: fsdp at 2 workers" in out, out
    c = Client(server.url, server.admin_token)
    job_id = int(out.split("job ")[1].split()[0])
    done = c.wait(job_id, timeout=420)
    log = b"".join(c.logs(job_id, rank=0)).decode()
    assert done["state"] == "succeeded", (done, log[-3000:])
    assert done["memory_mb_per_worker"] == 1200
    folder = server.home / "jobs" / str(job_id)
    assert list((folder / "checkpoints").glob("ckpt-*.dcp")), "a sharded checkpoint"
    assert (folder / "model" / "model.pt2").exists() and "model artifact written" in log

    # the same job whole on every worker, submitted past the CLI's estimate: the kernel stops it
    ddp = c.submit(image_classifier(["--dataset", "shapes", *TRAIN, "--strategy", "ddp"]), workers=2,
                   gpus_per_worker=0, memory_mb_per_worker=1200, own_folder=True, datasets=["shapes"],
                   env={"PATH": os.environ["PATH"]})
    failed = c.wait(ddp["id"], timeout=420)
    assert failed["state"] == "failed" and "out of memory (limit 1200 MiB)" in failed["reason"], failed
