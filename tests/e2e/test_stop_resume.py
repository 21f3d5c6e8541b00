"""Stop, resume and reclaim of the built-in trainer as a user runs it: a dataset read through
deeppod.runtime.data, the trainer's default loader workers, the CLI and the SDK."""

import os
import subprocess
import sys

import pytest

from deeppod import Client
from deeppod.runtime.trainers.digits import write_digits
from tests.helpers import wait_until

pytestmark = pytest.mark.slow

SMALL = ["--model", "small-cnn", "--image-size", "16", "--epochs", "2", "--batch-size", "32", "--lr", "0.05",
         "--step-delay", "0.1"]


def cli_env(server, token, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPPOD_")}
    env.update({"DEEPPOD_API_URL": server.url, "DEEPPOD_TOKEN": token,
                "DEEPPOD_CONFIG": str(tmp_path / "c.json"), "COLUMNS": "200"})
    return env


def cli(env, *args, cwd=None):
    p = subprocess.run([sys.executable, "-m", "deeppod.cli", *args], env=env, capture_output=True, text=True,
                       timeout=300, cwd=cwd)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def log_of(c, job_id, rank=0) -> str:
    return b"".join(c.logs(job_id, rank=rank)).decode()


def step_in(text: str, marker: str) -> int:
    return int(text.split(marker)[-1].split(" step ")[1].split()[0].rstrip(","))


def last_step(c, job_id) -> int:
    loss = c.metrics(job_id)["metrics"].get("loss")
    return loss["last"][0] if loss else 0


@pytest.mark.timeout(660)  # its own longest wait, and a minute to report
def test_a_stopped_training_job_resumes_at_the_step_it_stopped_at(fresh_server, tmp_path):
    # the grace a user gets (30 s), not the harness's 5 s: on a loaded machine the worker's way out
    # (checkpoint, metrics, exit) once overran 5 s and was killed; the test waits only as long as it takes
    fresh_server.extra_env["DEEPPOD_GRACE_SECONDS"] = "30"
    server = fresh_server.start()
    env = cli_env(server, server.admin_token, tmp_path)
    cli(env, "data", "ingest", "digits", str(write_digits(tmp_path / "digits")), "--split", "val=0.2")
    out = cli(env, "train", "image-classifier", "--dataset", "digits", *SMALL, cwd=tmp_path)
    job_id = int(out.split()[1])
    c = Client(server.url, server.admin_token)
    wait_until(lambda: last_step(c, job_id) >= 8, 180, what="a few training steps")

    cli(env, "stop", str(job_id))
    job = c.wait(job_id, timeout=60)  # returns for a stopped job
    log = log_of(c, job_id)
    assert job["state"] == "stopped", (job, log[-2000:])
    assert "DataLoader worker" not in log and "checkpoint saved" in log
    step = step_in(log, "stopping at epoch ")
    assert job["reason"] == f"stopped by admin; checkpoint saved at step {step}"
    assert job["exit_codes"] == {"0": 75}, (job, log[-3000:])

    cli(env, "resume", str(job_id))
    wait_until(lambda: "resuming at epoch" in log_of(c, job_id), 120, what="the job to resume")
    assert step_in(log_of(c, job_id), "resuming at epoch ") == step
    final = c.wait(job_id, timeout=600)
    assert final["state"] == "succeeded", (final, log_of(c, job_id)[-2000:])


def test_a_reclaimed_trainer_checkpoints_and_resumes_at_that_step(fresh_server, tmp_path):
    fresh_server.extra_env = {"DEEPPOD_RESIZE_AFTER_SECONDS": "0", "DEEPPOD_GRACE_SECONDS": "20"}
    server = fresh_server.start()
    admin = Client(server.url, server.admin_token)
    tokens = {}
    for t in ("a", "b"):
        admin.create_tenant(t)
        tokens[t] = admin.create_user(f"user-{t}", t)["token"]
    admin.apply_plan({"tenants": [{"name": "a", "guaranteed": 2}, {"name": "b", "guaranteed": 2}]})
    a, b = Client(server.url, tokens["a"]), Client(server.url, tokens["b"])
    env = cli_env(server, tokens["b"], tmp_path)
    cli(env, "data", "ingest", "digits", str(write_digits(tmp_path / "digits")), "--split", "val=0.2")
    # a fixed size: reclaim preempts it whole (an elastic trainer is shrunk in place instead:
    # tests/e2e/test_reclaim.py), and it resumes from the checkpoint it saved on SIGTERM
    out = cli(env, "train", "image-classifier", "--dataset", "digits", *SMALL, "--workers", "3",
              "--gpus-per-worker", "1", cwd=tmp_path)
    job_id = int(out.split()[1])
    wait_until(lambda: len((b.job(job_id)["allocation"] or {}).get("workers", [])) == 3, 60,
               what="b to borrow a third GPU")
    wait_until(lambda: last_step(b, job_id) >= 6, 180, what="a few steps on 3 workers")

    owner = a.submit([sys.executable, "-c", "import time; time.sleep(2)"], name="owner", workers=2,
                     gpus_per_worker=1, workdir=str(tmp_path))
    wait_until(lambda: b.job(job_id)["restart_count"] >= 1, 60, what="the borrower to be preempted")
    events = b.events(job_id)
    requeued = [e["message"] for e in events if e["kind"] == "requeued"][0]
    log = log_of(b, job_id)
    assert "DataLoader worker" not in log, log[-2000:]
    step = step_in(log, "stopping at epoch ")
    assert "reclaim for tenant a" in requeued and f"checkpoint saved at step {step}" in requeued, requeued
    assert a.wait(owner["id"], 120)["state"] == "succeeded"
    wait_until(lambda: "resuming at epoch" in log_of(b, job_id), 120, what="the borrower to resume")
    assert step_in(log_of(b, job_id), "resuming at epoch ") == step
    assert b.wait(job_id, 600)["state"] == "succeeded"


def test_a_stop_during_a_step_longer_than_the_grace_keeps_the_last_completed_step(fresh_server, tmp_path):
    """The defaults a new user gets (--model auto, the images' own size, 2 loader workers), a step
    slower than the grace: the stop still ends with a checkpoint, not a SIGKILL."""
    fresh_server.extra_env = {"DEEPPOD_GRACE_SECONDS": "4"}
    server = fresh_server.start()
    env = cli_env(server, server.admin_token, tmp_path)
    cli(env, "data", "ingest", "digits", str(write_digits(tmp_path / "digits")), "--split", "val=0.2")
    out = cli(env, "train", "image-classifier", "--dataset", "digits", "--batch-size", "32", "--step-delay", "8",
              cwd=tmp_path)
    job_id = int(out.split()[1])
    c = Client(server.url, server.admin_token)
    wait_until(lambda: last_step(c, job_id) >= 1, 180, what="a first (slow) step")
    assert "auto: model small-cnn (CPU only" in log_of(c, job_id)  # and the digits' 8 px images at 16
    cli(env, "stop", str(job_id))
    job = c.wait(job_id, timeout=60)
    log = log_of(c, job_id)
    assert job["state"] == "stopped", (job, log[-2000:])
    assert "saving the last completed step" in log, log[-2000:]
    assert job["exit_codes"] == {"0": 75}, (job, log[-2000:])  # not SIGKILLed at the grace's end
    assert job["reason"].startswith("stopped by admin; checkpoint saved at step "), job["reason"]
    assert int(job["reason"].split()[-1]) >= 1
