"""The training runtime end to end: graceful stop and resume on other world sizes, a killed
worker, and the built-in trainer on real data (scikit-learn's digits)."""

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from deeppod import Client
from deeppod.contract import EXIT_RESUME, free_port, worker_env
from deeppod.executor.base import LaunchSpec, WorkerSpec
from deeppod.executor.local import LocalExecutor
from deeppod.runtime.trainers.digits import write_digits
from tests.e2e.datasets import digits_version
from tests.helpers import wait_until

TRAINER = [sys.executable, "-m", "deeppod.runtime.trainers.image_classifier"]


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return write_digits(tmp_path_factory.mktemp("digits") / "digits")


@pytest.fixture(scope="module")
def version(tmp_path_factory):
    """A dataset version: the trainer reads it through deeppod.runtime.data's loader."""
    return digits_version(tmp_path_factory.mktemp("version"))


def small_args(data, records, epochs=1, delay=0.05, extra=()):
    """A small, slow-stepping run with the trainer's defaults otherwise (2 loader workers)."""
    return ["--data", str(data), "--model", "small-cnn", "--image-size", "16", "--epochs", str(epochs),
            "--batch-size", "32", "--lr", "0.05", "--step-delay", str(delay),
            "--record-samples", str(records), *extra]


def stopped_at(log: str) -> int:
    return int(log.split("stopping at epoch ")[-1].split(" step ")[1].split()[0])


def resumed_at(log: str) -> int:
    return int(log.split("resuming at epoch ")[-1].split(" step ")[1].split(",")[0])


def launch(ex, job_dir, command, workers, restart, grace=20.0):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEEPPOD_", "PYTEST_"))}
    specs = [WorkerSpec(r, "n", worker_env(env, {}, job_id=0, rank=r, world_size=workers, local_rank=r,
                                           local_world_size=workers, node_rank=0, master_addr="127.0.0.1",
                                           master_port=port, gpus=(), cpus=1, checkpoint_dir=str(job_dir / "ckpt"),
                                           api_url="", token="", restart_count=restart))
             for r in range(workers)]
    return ex.launch(LaunchSpec(job_id=0, job_dir=job_dir, command=command, workdir=str(job_dir),
                                workers=specs, grace_seconds=grace))


def all_logs(logs: Path) -> str:
    """Every rank's log, each under its name: a failure shows the rank that failed."""
    return "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')}" for f in sorted(logs.glob("rank-*.log")))


def steps_done(records: Path) -> int:
    return sum(1 for f in records.glob("*.txt") for _ in f.open())


def consumed(records: Path, epoch: int, keep_until: dict[int, int] | None = None) -> Counter:
    """Sample indices trained on in ``epoch``; ``keep_until[run]`` drops steps a run lost
    (those after its last checkpoint)."""
    c = Counter()
    for f in records.glob("run*-rank*.txt"):
        run = int(f.name.split("-")[0][3:])
        for line in f.open():
            e, step, *idx = line.split()
            if int(e) == epoch and (keep_until is None or int(step) <= keep_until.get(run, 1 << 30)):
                c.update(int(i) for i in idx)
    return c


@pytest.mark.timeout(900)  # its own waits add up past the default 300 s on a loaded 2-core machine
def test_stop_then_resume_on_1_then_3_workers_completes_the_epoch_exactly(tmp_path, version, digits):
    ex, job_dir, records = LocalExecutor(), tmp_path / "job", tmp_path / "records"
    job_dir.mkdir()
    records.mkdir()
    command = TRAINER + small_args(version, records, epochs=2, delay=0.1)
    logs = job_dir / "logs"

    # 2 workers, then SIGTERM: checkpoint and the documented exit code, well within the grace
    h = launch(ex, job_dir, command, 2, restart=0)
    wait_until(lambda: steps_done(records) >= 2 * 8, 120, what="a few steps on 2 workers")
    t0 = time.monotonic()
    ex.terminate(h)
    st = wait_until(lambda: (s := ex.poll(h)).finished and s, 60)
    assert st.exit_codes == {0: EXIT_RESUME, 1: EXIT_RESUME}, all_logs(logs)
    assert time.monotonic() - t0 < 20
    first = (logs / "rank-0.log").read_text()
    assert "checkpoint saved" in first and "DataLoader worker" not in first
    step = stopped_at(first)
    assert step >= 8

    # 1 worker resumes mid-epoch at the very step it stopped at, is stopped again
    h = launch(ex, job_dir, command, 1, restart=1)
    wait_until(lambda: "resuming at epoch" in (logs / "rank-0.log").read_text(), 120)
    assert resumed_at((logs / "rank-0.log").read_text()) == step
    before = steps_done(records)
    wait_until(lambda: steps_done(records) >= before + 6, 120)
    ex.terminate(h)
    assert wait_until(lambda: (s := ex.poll(h)).finished and s, 60).exit_codes == {0: EXIT_RESUME}, all_logs(logs)
    step = stopped_at((logs / "rank-0.log").read_text())

    # 3 workers finish the job
    h = launch(ex, job_dir, command, 3, restart=2)
    st = wait_until(lambda: (s := ex.poll(h)).finished and s, 300)
    log = (logs / "rank-0.log").read_text()
    assert st.exit_codes == {0: 0, 1: 0, 2: 0}, all_logs(logs)
    assert log.count("resuming at epoch 1") == 2 and "world 3 (base 2)" in log
    assert resumed_at(log) == step
    # every training sample of the interrupted epoch was seen exactly once over 2 -> 1 -> 3 workers
    epoch0 = consumed(records, 0)
    n = int(log.split(" train / ")[0].split("; ")[-1])
    assert sorted(epoch0) == list(range(n)) and set(epoch0.values()) == {1}
    assert sorted(consumed(records, 1)) == list(range(n))
    assert (job_dir / "model" / "model.pt2").exists()  # the artifact goes to JOB_DIR/model

    # transfer learning: a new run starts from this model's weights (here on 2 of the classes)
    two = tmp_path / "two"
    for cls in ("0", "1"):
        (two / cls).mkdir(parents=True)
        for f in list((Path(digits) / cls).glob("*.png"))[:60]:
            (two / cls / f.name).write_bytes(f.read_bytes())
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPPOD_")}
    p = subprocess.run(TRAINER + ["--data", str(two), "--model", "small-cnn", "--image-size", "16", "--epochs", "1",
                                  "--batch-size", "16", "--lr", "0.01", "--loader-workers", "0", "--finetune-from",
                                  str(job_dir / "model"), "--output", str(tmp_path / "ft")],
                       env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "fine-tuning from" in p.stdout and "['10.bias', '10.weight']" in p.stdout  # only the new head
    ft = json.loads((tmp_path / "ft" / "signature.json").read_text())
    assert ft["classes"] == ["0", "1"] and ft["metrics"]["val_accuracy"] > 0.8


def test_a_group_wide_sigterm_still_checkpoints_with_loader_workers(tmp_path, digits):
    """Launchers such as torchrun signal the worker's whole process group: the trainer's
    loader workers (torch's DataLoader over a plain folder here) must not die first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEEPPOD_", "PYTEST_"))}
    env["DEEPPOD_CHECKPOINT_DIR"] = str(tmp_path / "ckpt")
    records = tmp_path / "records"
    records.mkdir()
    log = tmp_path / "out.log"
    with open(log, "wb") as out:
        p = subprocess.Popen(TRAINER + small_args(digits, records, delay=0.1), env=env, cwd=tmp_path,
                             stdout=out, stderr=subprocess.STDOUT, process_group=0)
    try:
        wait_until(lambda: steps_done(records) >= 4, 120, what="a few steps")
        os.killpg(p.pid, signal.SIGTERM)
        assert p.wait(60) == EXIT_RESUME, log.read_text()
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert "checkpoint saved" in log.read_text()
    assert list((tmp_path / "ckpt").glob("ckpt-*.pt"))


def test_resuming_a_finished_run_from_its_final_checkpoint_writes_the_model(tmp_path, version):
    """A job resumed after its last epoch's checkpoint has nothing left to train: it evaluates
    and writes its artifact instead of crashing."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEEPPOD_", "PYTEST_"))}
    env["DEEPPOD_CHECKPOINT_DIR"] = str(tmp_path / "ckpt")
    records = tmp_path / "records"
    records.mkdir()
    command = TRAINER + small_args(version, records, delay=0) + ["--output", str(tmp_path / "model")]
    first = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    (tmp_path / "model" / "signature.json").unlink()
    again = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resuming at epoch 1" in again.stdout
    assert json.loads((tmp_path / "model" / "signature.json").read_text())["metrics"]["val_accuracy"] > 0


def test_a_stop_after_an_epochs_last_step_resumes_into_the_next_epoch(tmp_path, version):
    """Found by following the README: a stop that lands after the last step of an epoch saves
    a checkpoint with the epoch's samples all consumed; the resumed run must evaluate that
    epoch and go on, not crash on the loss of a loop that ran no step."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEEPPOD_", "PYTEST_"))}
    records = tmp_path / "records"
    records.mkdir()
    probe_env = {**env, "DEEPPOD_CHECKPOINT_DIR": str(tmp_path / "probe")}
    probe = subprocess.run(TRAINER + small_args(version, records, delay=0) + ["--output", str(tmp_path / "m0")],
                           env=probe_env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stdout + probe.stderr
    per_epoch = steps_done(records)
    env["DEEPPOD_CHECKPOINT_DIR"] = str(tmp_path / "ckpt")
    common = small_args(version, tmp_path / "records", epochs=2, delay=0) + ["--output", str(tmp_path / "model")]
    first = subprocess.run(TRAINER + common + ["--max-steps", str(per_epoch)], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    out = first.stdout + first.stderr
    assert first.returncode == 0 and f"stopping at epoch 1 step {per_epoch}" in first.stdout, out
    again = subprocess.run(TRAINER + common, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"resuming at epoch 1 step {per_epoch}" in again.stdout and "epoch 1/2: loss - val_accuracy" in again.stdout
    assert "epoch 2/2: loss " in again.stdout and steps_done(records) == 3 * per_epoch  # probe, epochs 1 and 2


def test_killed_worker_requeues_and_resumes_from_the_last_checkpoint(fresh_server, tmp_path, digits):
    fresh_server.extra_env = {"DEEPPOD_GRACE_SECONDS": "10"}
    server = fresh_server.start()
    c = Client(server.url, server.admin_token)
    records = tmp_path / "records"
    records.mkdir()
    job = c.submit(TRAINER + small_args(digits, records, delay=0.1, extra=("--checkpoint-every", "4")), workers=2,
                   max_restarts=1, workdir=str(tmp_path), env={"PATH": os.environ["PATH"]})
    job_dir = server.home / "jobs" / str(job["id"])
    wait_until(lambda: any(p.name.startswith("ckpt-") for p in (job_dir / "checkpoints").glob("*")), 120,
               what="a periodic checkpoint")
    wait_until(lambda: steps_done(records) >= 2 * 6, 60)
    victim = json.loads((job_dir / "workers.json").read_text())["1"]
    os.kill(int(victim), signal.SIGKILL)
    final = c.wait(job["id"], timeout=300)
    events = [e["kind"] for e in c.events(job["id"])]
    assert final["state"] == "succeeded", (final, events)
    assert final["restart_count"] == 1 and "requeued" in events
    log = b"".join(c.logs(job["id"], rank=0)).decode()
    resumed_step = int(log.split("resuming at epoch 1 step ")[1].split(",")[0])
    lost = max(int(line.split()[1]) for line in (records / "run0-rank0.txt").open()) - resumed_step
    assert 0 <= lost <= 4 + 1  # at most one checkpoint interval (and the step in flight)
    epoch0 = consumed(records, 0, keep_until={0: resumed_step})
    assert set(epoch0.values()) == {1} and len(epoch0) == max(epoch0) + 1


@pytest.mark.timeout(660)  # its own longest wait, and a minute to report
def test_digits_end_to_end_through_the_cli(fresh_server, tmp_path, digits):
    """What a new user gets: the trainer's own model and size for this machine (small-cnn on
    CPU, the digits' 8-px images at 16), its default loader workers."""
    server = fresh_server.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPPOD_")}
    env.update({"DEEPPOD_API_URL": server.url, "DEEPPOD_TOKEN": server.admin_token,
                "DEEPPOD_CONFIG": str(tmp_path / "c.json"), "COLUMNS": "200"})
    p = subprocess.run([sys.executable, "-m", "deeppod.cli", "train", "image-classifier", "--data", str(digits),
                        "--epochs", "8", "--batch-size", "64", "--lr", "0.05", "--workers", "2",
                        "--histograms-every", "10", "-f"],
                       env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    job_id = int(p.stdout.split()[1])
    c = Client(server.url, server.admin_token)
    model = server.home / "jobs" / str(job_id) / "model"
    sig = json.loads((model / "signature.json").read_text())
    assert sig["metrics"]["val_accuracy"] > 0.90, sig["metrics"]
    assert sig["classes"] == [str(i) for i in range(10)] and sig["input"]["shape"] == [3, 16, 16]
    assert sig["model"] == "small-cnn" and "auto: model small-cnn (CPU only" in p.stdout
    assert (model / "weights.pt").exists() and (model / "model.pt2").exists()
    # live metrics reached the control plane, and TensorBoard files the job folder
    m = c.metrics(job_id)["metrics"]
    assert {"loss", "accuracy", "val_accuracy", "lr", "images_per_second"} <= set(m)
    assert m["val_accuracy"]["last"][1] > 0.90
    assert c.histograms(job_id, max_steps=2)
    assert list((server.home / "jobs" / str(job_id) / "tensorboard").glob("events.out.tfevents.*"))
    # the exported program answers like the trained model (what serving will load)
    import torch

    program = torch.export.load(str(model / "model.pt2")).module()
    assert program(torch.zeros(3, 3, 16, 16)).shape == (3, 10)


def test_the_trainer_can_decode_on_the_device(tmp_path, version):
    """--decode-on device: the loader's workers send bytes and crops, the training process
    decodes (nvJPEG on a GPU; the same call on the CPU here). Every training sample once."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEEPPOD_", "PYTEST_"))}
    env["DEEPPOD_CHECKPOINT_DIR"] = str(tmp_path / "ckpt")
    records = tmp_path / "records"
    records.mkdir()
    run = subprocess.run(TRAINER + small_args(version, records, delay=0) + ["--decode-on", "device", "--output",
                                                                           str(tmp_path / "model")],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    train = int(run.stdout.split(" train / ")[0].split()[-1])
    seen = consumed(records, 0)
    assert len(seen) == train and set(seen.values()) == {1}
    assert json.loads((tmp_path / "model" / "signature.json").read_text())["metrics"]["val_accuracy"] >= 0
