"""A model larger than one worker's memory, as a user trains it: ``deeppod train --memory``
on the server a user gets (sandboxed as root, the kernel holding each worker to its memory).
ResNet-101 with Adam needs about 1.7 GiB per worker whole; at 1,200 MiB the CLI shards it
over two workers and it trains; DDP is refused at submit with the estimate, and a DDP job
submitted past the CLI is stopped by the kernel, so the refusal was right. A sharded elastic
job grows from 2 to 3 workers by a restart from its sharded checkpoint, its loss going on."""

import os
import sys

import numpy as np
import pytest
from PIL import Image

from deeppod import Client
from deeppod.runtime.trainers.command import image_classifier
from tests.helpers import LiveServer, wait_until

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


def images(root):
    rng = np.random.default_rng(0)
    for c in range(3):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(30):
            Image.fromarray((rng.random((16, 16, 3)) * 80 + c * 60).astype("uint8")).save(root / f"c{c}" / f"{i}.png")
    return root


@pytest.mark.timeout(600)
def test_a_model_larger_than_a_worker_trains_sharded_and_ddp_is_refused(server, tmp_path):
    server.cli(tmp_path, "data", "ingest", "shapes", str(images(tmp_path / "shapes")), "--split", "val=0.2")
    base = ["train", "image-classifier", "--dataset", "shapes", *TRAIN, "-n", "2", "--memory", MEMORY]

    refused = server.cli(tmp_path, *base, "--strategy", "ddp", check=False)
    assert refused.returncode == 2, refused.stderr
    assert "resnet101 does not fit in 1,200 MiB per worker" in refused.stderr, refused.stderr
    assert "ddp at 2 workers" in refused.stderr and "optimizer" in refused.stderr

    out = server.cli(tmp_path, *base).stdout
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


@pytest.mark.timeout(900)
def test_a_sharded_job_grows_from_2_to_3_workers_by_its_sharded_checkpoint(tmp_path):
    """Through the server a user gets (sandboxed as root): an elastic --strategy fsdp trainer
    starts on the 2 GPUs left free; when the third frees, the scheduler grows it, the trainer
    says it resizes by a restart (its model is sharded), stops at 2 with a sharded checkpoint
    and resumes at 3 from it: the same step, the loss going on from where it was, every
    sample of its epochs seen exactly once."""
    from deeppod.executor import sandbox
    from deeppod.runtime.trainers.digits import write_digits
    from tests.e2e.test_training import consumed

    if sandbox.supported() is not None:
        pytest.skip(sandbox.supported())
    work = tmp_path / "work"  # the tenant's root
    work.mkdir()
    s = LiveServer(tmp_path / "home", gpus=3, isolation=None, extra_env={"DEEPPOD_RESIZE_AFTER_SECONDS": "0",
                                                                         "DEEPPOD_WORK_ROOTS": str(work)}).start()
    try:
        c = Client(s.url, s.admin_token)
        if c.whoami()["isolation"] != "sandbox":
            pytest.skip("needs a root server (the sandbox a user gets as root)")
        digits, records = write_digits(work / "digits"), work / "records"
        records.mkdir()
        os.chmod(tmp_path, 0o755)
        os.chmod(work, 0o755)
        os.chmod(records, 0o777)  # the sandboxed workers write their sample records here
        blocker = c.submit([sys.executable, "-c", "import time; time.sleep(600)"], workers=1, gpus_per_worker=1,
                           workdir=str(work))
        wait_until(lambda: c.job(blocker["id"])["state"] == "running", 60, what="the blocker to hold a GPU")
        trainer = [sys.executable, "-m", "deeppod.runtime.trainers.image_classifier", "--data", str(digits),
                   "--model", "small-cnn", "--image-size", "16", "--epochs", "2", "--batch-size", "32", "--lr", "0.05",
                   "--step-delay", "0.1", "--record-samples", str(records), "--strategy", "fsdp"]
        job = c.submit(trainer, name="sharded", workers=2, max_workers=3, gpus_per_worker=1, workdir=str(work))
        ckpt = s.home / "jobs" / str(job["id"]) / "checkpoints"

        def losses():
            return {st: v for st, v in c.metrics(job["id"], ["loss"])["metrics"].get("loss", {}).get("series", [])}

        wait_until(lambda: len(losses()) >= 20 and (ckpt / ".resize-by-restart").exists(), 300,
                   what="20 sharded steps on 2 workers")
        c.stop(blocker["id"])
        final = c.wait(job["id"], 600)
        log = b"".join(c.logs(job["id"], rank=0)).decode()
        assert final["state"] == "succeeded" and final["restart_count"] == 1, (final, log[-3000:])
        events = [(e["kind"], e["message"]) for e in c.events(job["id"])]
        assert any("restarts from its checkpoint with 3 workers (its model is sharded" in m for _, m in events), events
        assert "resuming at epoch" in log and "world 3 (base 2)" in log
        assert list(ckpt.glob("ckpt-*.dcp")), "sharded checkpoints"
        stop = int(log.split("stopping at epoch ")[-1].split(" step ")[1].split()[0])
        assert int(log.split("resuming at epoch ")[-1].split(" step ")[1].split(",")[0]) == stop
        curve = losses()
        steps = sorted(curve)
        first, before, after = (sum(curve[k] for k in ks) / len(ks) for ks in
                                (steps[:3], [k for k in steps if k <= stop][-3:], [k for k in steps if k > stop][:3]))
        assert after < 0.9 * first and abs(after - before) < 0.25 * first, (first, before, after)  # it goes on
        n = int(log.split(" train / ")[0].split("; ")[-1])
        for epoch in (0, 1):
            seen = consumed(records, epoch)
            assert sorted(seen) == list(range(n)) and set(seen.values()) == {1}, f"epoch {epoch}: each sample once"
    finally:
        s.stop()
        s.cleanup_jobs()
