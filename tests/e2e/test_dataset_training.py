"""The built-in trainer reads a dataset by name: ingest through the CLI, train through the
CLI, and the platform stages the version and passes its folder to the job."""

import json
import os
import subprocess
import sys

import pytest

from deeppod import Client
from deeppod.runtime.trainers.digits import write_digits

pytestmark = pytest.mark.slow


@pytest.mark.timeout(660)  # its own longest wait, and a minute to report
def test_train_from_a_dataset_name(fresh_server, tmp_path):
    server = fresh_server.start()
    digits = write_digits(tmp_path / "digits")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPPOD_")}
    env.update({"DEEPPOD_API_URL": server.url, "DEEPPOD_TOKEN": server.admin_token,
                "DEEPPOD_CONFIG": str(tmp_path / "c.json"), "COLUMNS": "200"})
    cli = [sys.executable, "-m", "deeppod.cli"]
    p = subprocess.run([*cli, "data", "ingest", "digits", str(digits), "--split", "val=0.2", "--tag", "source=sklearn"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "digits@1: 1797 images, 10 classes" in p.stdout, p.stdout
    # the model, image size and loader workers a user gets by default (small-cnn at 16 px here)
    p = subprocess.run([*cli, "train", "image-classifier", "--dataset", "digits", "--epochs", "8",
                        "--batch-size", "64", "--lr", "0.05", "--workers", "2",
                        "--min-crop", "0.8", "--no-hflip", "--grace", "45", "-f"],
                       env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    job_id = int(p.stdout.split()[1])
    job = Client(server.url, server.admin_token).job(job_id)
    assert job["datasets"][0]["ref"] == "digits@1" and job["datasets"][0]["env"] == "DEEPPOD_DATA_DIGITS"
    assert job["grace_seconds"] == 45  # the trainer's time to checkpoint on a stop
    sig = json.loads((server.home / "jobs" / str(job_id) / "model" / "signature.json").read_text())
    assert sig["dataset"] == "digits@1"
    assert sig["classes"] == [str(i) for i in range(10)]
    assert sig["metrics"]["val_accuracy"] > 0.85, sig["metrics"]
