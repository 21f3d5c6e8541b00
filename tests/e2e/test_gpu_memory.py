"""GPU memory requests, as a user meets them: a server whose GPUs say how much memory they have
(here logical slots that stand for 1 GiB GPUs, `deeppod server --gpus 2 --gpu-memory 1G`).
`deeppod train` estimates what each GPU must hold and refuses, with the estimates, a model no
GPU of the cluster can hold; one that fits asks the scheduler for GPUs of its estimate and
starts on them; `deeppod submit --gpu-memory` more than any GPU has is refused at submit."""

import sys

import pytest

from deeppod import Client
from tests.datasets.images import class_folders
from tests.e2e.browser import shot, sign_in
from tests.helpers import LiveServer, wait_until

pytestmark = pytest.mark.slow

TRAIN = ["--image-size", "32", "--batch-size", "16", "--optimizer", "adam", "--epochs", "1"]


@pytest.fixture
def server(tmp_path):
    s = LiveServer(tmp_path / "home", gpus=2, extra_env={"DEEPPOD_GPU_MEMORY_MB": "1024"}).start()
    try:
        yield s
    finally:
        s.stop()
        s.cleanup_jobs()


@pytest.mark.timeout(300)
def test_train_asks_for_gpus_that_hold_its_estimate_and_a_model_none_can_hold_is_refused(server, tmp_path, browser):
    data = str(class_folders(tmp_path / "pics", size=(32, 32)))
    c = Client(server.url, server.admin_token)
    assert [n["gpu_memory_mb"] for n in c.nodes()] == [1024]

    refused = server.cli(tmp_path, "train", "image-classifier", "--data", data, "--model", "resnet152",
                         "--image-size", "224", "--batch-size", "64", "-n", "2", check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    said = " ".join(refused.stderr.split())  # the error box wraps lines
    assert "resnet152 does not fit in 1,024 MiB per GPU" in said, said
    assert "fsdp with activation checkpointing and offload at 2 workers" in said and "--gpu-memory" in said
    assert c.jobs() == []

    out = server.cli(tmp_path, "train", "image-classifier", "--data", data, "--model", "resnet50", *TRAIN,
              "-n", "2").stdout
    assert "GPU memory: fsdp at 2 workers" in out, out  # DDP's whole model does not fit 1 GiB; half of it does
    job_id = int(out.split("job ")[1].split()[0])
    job = c.job(job_id)
    estimate = int(out.split("GPU memory: fsdp at 2 workers: ")[1].split()[0].replace(",", ""))
    assert job["gpu_memory_mb"] == estimate and 600 < estimate <= 1024
    assert "--strategy fsdp" in " ".join(job["command"])
    wait_until(lambda: c.job(job_id)["state"] in ("running", "succeeded"), 60, what="the job to start on the GPUs")
    assert f"GPU of {estimate} MiB" in server.cli(tmp_path, "job", "show", str(job_id)).stdout
    page = sign_in(browser, server.url, server.admin_token)
    page.goto(f"{server.url}/jobs/{job_id}")
    assert f"2 × 1 GPU of {estimate} MiB" in page.inner_text("body")
    shot(page, "job-gpu-memory")
    c.cancel(job_id)

    too_big = server.cli(tmp_path, "submit", "--gpu-memory", "2G", "--", sys.executable, "-c", "pass", check=False)
    assert too_big.returncode != 0
    said = " ".join(too_big.stderr.split())
    assert "each GPU must have 2048 MiB of memory but the largest GPUs have 1024 MiB" in said, said
