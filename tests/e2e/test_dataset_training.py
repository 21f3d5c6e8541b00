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


@pytest.fixture(scope="module")
def sandboxed(tmp_path_factory):
    """The server a user gets as root: jobs sandboxed as their tenant's identity."""
    from deeppod.executor import sandbox
    from tests.helpers import LiveServer

    if sandbox.supported() is not None:
        pytest.skip(sandbox.supported())
    root = tmp_path_factory.mktemp("sandboxed")
    work = root / "work"  # the tenant's root: where it names folders from
    work.mkdir()
    os.chmod(root, 0o755)
    os.chmod(work, 0o755)
    server = LiveServer(root / "home", isolation=None, extra_env={"DEEPPOD_WORK_ROOTS": str(work)}).start()
    server.work = work
    if Client(server.url, server.admin_token).whoami()["isolation"] != "sandbox":
        server.stop()
        pytest.skip("needs a root server (the sandbox a user gets as root)")
    yield server
    server.stop()
    server.cleanup_jobs()


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


@pytest.mark.timeout(300)
def test_a_job_reads_a_text_dataset_by_name(sandboxed, tmp_path):
    """A text version staged for a job as any dataset is: runtime.text reads its split files
    inside the job's sandbox, by the dataset's name."""
    c = Client(sandboxed.url, sandboxed.admin_token)
    src = tmp_path / "qa.jsonl"
    src.write_text("\n".join(json.dumps({"prompt": f"{i}+{i}=", "completion": str(2 * i)}) for i in range(50)))
    v = c.datasets.ingest("qa-e2e", str(src), policy={"val": 0.2})["versions"][-1]
    assert v["stats"]["per_split"] == {"train": 40, "val": 10}
    script = ("from deeppod.runtime.text import read_examples; "
              "train = list(read_examples('qa-e2e', 'train')); val = list(read_examples('qa-e2e', 'val')); "
              "print('read', len(train), len(val), sorted(int(x['completion']) for x in train + val) == "
              "list(range(0, 100, 2)))")
    job = c.submit([sys.executable, "-c", script], datasets=["qa-e2e"], gpus_per_worker=0, own_folder=True)
    done = c.wait(job["id"], timeout=240)
    log = b"".join(c.logs(job["id"], rank=0)).decode()
    assert done["state"] == "succeeded", (done, log[-2000:])
    assert "read 40 10 True" in log


@pytest.mark.timeout(300)
def test_a_job_loads_a_registered_language_model_by_name_read_only(sandboxed):
    """--model NAME: the version pinned at submit is bound read-only into the job's sandbox and
    named by DEEPPOD_MODEL_<NAME>; runtime.llama loads it by that name."""
    from tests.models.hf_folder import write_tiny_llama

    c = Client(sandboxed.url, sandboxed.admin_token)
    c.models.register("llama-e2e", path=str(write_tiny_llama(sandboxed.work / "tiny")))
    script = ("import os, torch; from deeppod.runtime import llama\n"
              "m = llama.load('llama-e2e')\n"
              "print('logits', tuple(m(torch.tensor([[1, 2, 3]]))[0].shape))\n"
              "try:\n"
              "    open(os.path.join(os.environ['DEEPPOD_MODEL_LLAMA_E2E'], 'planted'), 'w')\n"
              "    print('writable')\n"
              "except OSError as e:\n"
              "    print('read-only', e.errno)\n")
    job = c.submit([sys.executable, "-c", script], models=["llama-e2e"], gpus_per_worker=0, own_folder=True)
    assert job["models"][0]["ref"] == "llama-e2e@1"
    done = c.wait(job["id"], timeout=240)
    log = b"".join(c.logs(job["id"], rank=0)).decode()
    assert done["state"] == "succeeded", (done, log[-2000:])
    assert "logits (1, 3, 64)" in log and "read-only" in log and "writable" not in log, log[-2000:]
