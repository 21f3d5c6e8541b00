"""Borrow and reclaim on the local executor with 4 logical GPUs, as the issue describes."""

import json
import sys
import time

import pytest

from deeppod import Client
from tests.helpers import wait_until

# A training loop that checkpoints on SIGTERM and resumes from the checkpoint.
WORKER = r"""
import json, os, signal, sys, time
ckpt = os.path.join(os.environ["DEEPPOD_CHECKPOINT_DIR"], "state.json")
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
step = json.load(open(ckpt))["step"] if os.path.exists(ckpt) else 0
print(f"rank {rank}/{world} starting at step {step} (restart {os.environ['DEEPPOD_RESTART_COUNT']})", flush=True)
stop = False
def on_term(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)
while step < int(sys.argv[1]):
    if stop:
        if rank == 0:
            tmp = ckpt + ".tmp"
            json.dump({"step": step, "world": world}, open(tmp, "w"))
            os.replace(tmp, ckpt)
            print(f"checkpointed at step {step}", flush=True)
        sys.exit(0)
    time.sleep(0.1)
    step += 1
print(f"rank {rank} finished at step {step}", flush=True)
"""


def setup(server, plan):
    admin = Client(server.url, server.admin_token)
    tokens = {}
    for t in ("a", "b"):
        admin.create_tenant(t)
        tokens[t] = admin.create_user(f"user-{t}", t)["token"]
    admin.apply_plan(plan)
    return admin, Client(server.url, tokens["a"]), Client(server.url, tokens["b"])


def test_borrower_shrinks_owner_starts_within_grace_and_borrower_resumes(fresh_server, tmp_path):
    fresh_server.extra_env = {"DEEPPOD_RESIZE_AFTER_SECONDS": "0", "DEEPPOD_GRACE_SECONDS": "5"}
    server = fresh_server.start()
    admin, a, b = setup(server, {"tenants": [{"name": "a", "guaranteed": 2}, {"name": "b", "guaranteed": 2}]})
    (tmp_path / "worker.py").write_text(WORKER)
    borrower = b.submit([sys.executable, "worker.py", "120"], name="elastic", workers=1, max_workers=4,
                        gpus_per_worker=1, workdir=str(tmp_path))
    wait_until(lambda: b.job(borrower["id"])["state"] == "running"
               and len(b.job(borrower["id"])["allocation"]["workers"]) == 4, 30, what="b to borrow all 4 GPUs")
    wait_until(lambda: b"".join(b.logs(borrower["id"])).count(b"starting at step 0") == 4, 30)

    t0 = time.monotonic()
    owner = a.submit([sys.executable, "-c", "import time; time.sleep(3); print('a done')"], name="owner",
                     workers=2, gpus_per_worker=1, workdir=str(tmp_path))
    wait_until(lambda: a.job(owner["id"])["state"] == "running", 5 + 10, what="a's job to start")
    took = time.monotonic() - t0
    assert took < 5 + 5, f"a waited {took:.1f}s; grace is 5s"

    events = [e["kind"] for e in b.events(borrower["id"])]
    assert "resizing" in events and "requeued" in events
    state = json.loads((server.home / "jobs" / str(borrower["id"]) / "checkpoints" / "state.json").read_text())
    assert state["world"] == 4 and state["step"] > 0  # it checkpointed on SIGTERM
    # b resumes from its checkpoint, same job id, on the 2 GPUs that are left
    wait_until(lambda: b.job(borrower["id"])["state"] == "running", 20)
    j = b.job(borrower["id"])
    assert j["id"] == borrower["id"] and j["restart_count"] >= 1
    wait_until(lambda: f"starting at step {state['step']}".encode() in b"".join(b.logs(borrower["id"])), 20)
    assert a.wait(owner["id"], 30)["state"] == "succeeded"
    final = b.wait(borrower["id"], 90)
    assert final["state"] == "succeeded", final
    # "why" is always answerable
    reasons = " ".join(e["message"] for e in b.events(borrower["id"]))
    assert "reclaim for tenant a" in reasons
    plan = admin.plan()
    assert {r["name"]: r["guaranteed"] for r in plan["tenants"]} == {"a": 2, "b": 2}


def test_owner_preempts_a_non_elastic_borrower(fresh_server, tmp_path):
    fresh_server.extra_env = {"DEEPPOD_GRACE_SECONDS": "5"}
    server = fresh_server.start()
    _, a, b = setup(server, {"tenants": [{"name": "a", "guaranteed": 2}, {"name": "b", "guaranteed": 0}]})
    (tmp_path / "worker.py").write_text(WORKER)
    borrower = b.submit([sys.executable, "worker.py", "60"], workers=4, gpus_per_worker=1, workdir=str(tmp_path))
    wait_until(lambda: b"".join(b.logs(borrower["id"])).count(b"starting at step 0") == 4, 30)
    owner = a.submit([sys.executable, "-c", "print('a ran')"], workers=2, gpus_per_worker=1, workdir=str(tmp_path))
    assert a.wait(owner["id"], 20)["state"] == "succeeded"
    kinds = [e["kind"] for e in b.events(borrower["id"])]
    assert kinds[:4] == ["queued", "started", "preempted", "requeued"]
    final = b.wait(borrower["id"], 60)
    assert final["state"] == "succeeded" and final["restart_count"] == 1
    assert b"checkpointed at step" in b"".join(b.logs(borrower["id"]))


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("isolation", ["sandbox"])  # what a user gets as root; the unsandboxed path is
# tests/executor's and tests/runtime/test_resize.py's (the same flow single-user took 50 s more here)
def test_the_built_in_trainer_is_shrunk_and_grown_in_place_by_the_server(fresh_server, tmp_path, isolation):
    """Through the real server: reclaim shrinks a borrowing trainer 4 -> 2 in place (no
    restart: the same processes go on), a's job runs, then the idle GPUs grow it back to 4 in
    place; every sample of its epochs is seen exactly once. In the sandbox too, where the
    job reads its world file through a read-only bind and the joiners run as its tenant."""
    import os

    from deeppod.executor import sandbox
    from deeppod.runtime.trainers.digits import write_digits
    from tests.e2e.test_training import consumed

    if isolation == "sandbox" and sandbox.supported() is not None:
        pytest.skip(sandbox.supported())
    work = tmp_path / "work"  # the tenant's root
    work.mkdir()
    fresh_server.extra_env = {"DEEPPOD_RESIZE_AFTER_SECONDS": "0", "DEEPPOD_GRACE_SECONDS": "20",
                              "DEEPPOD_ISOLATION": isolation, "DEEPPOD_WORK_ROOTS": str(work)}
    server = fresh_server.start()
    _, a, b = setup(server, {"tenants": [{"name": "a", "guaranteed": 2}, {"name": "b", "guaranteed": 2}]})
    digits, records = write_digits(work / "digits"), work / "records"
    records.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(work, 0o755)
    os.chmod(records, 0o777)  # the sandboxed workers write their sample records here
    trainer = [sys.executable, "-m", "deeppod.runtime.trainers.image_classifier", "--data", str(digits),
               "--model", "small-cnn", "--image-size", "16", "--epochs", "2", "--batch-size", "32", "--lr", "0.05",
               "--step-delay", "0.15", "--record-samples", str(records)]
    job = b.submit(trainer, name="elastic", workers=1, max_workers=4, gpus_per_worker=1, workdir=str(work))
    ckpt = server.home / "jobs" / str(job["id"]) / "checkpoints"
    wait_until(lambda: b.job(job["id"])["state"] == "running" and len(b.job(job["id"])["allocation"]["workers"]) == 4
               and (ckpt / ".resizable").exists() and len(list(records.glob("*.txt"))) == 4, 120,
               what="b's trainer on all 4 GPUs")

    owner = a.submit([sys.executable, "-c", "import time; time.sleep(3)"], workers=2, gpus_per_worker=1,
                     workdir=str(work))
    assert a.wait(owner["id"], 120)["state"] == "succeeded"
    wait_until(lambda: any(e["kind"] == "resized" and "from 2 to 4" in e["message"] for e in b.events(job["id"])),
               120, what="b to grow back in place")
    final = b.wait(job["id"], 600)
    assert final["state"] == "succeeded" and final["restart_count"] == 0, final
    events = [(e["kind"], e["message"]) for e in b.events(job["id"])]
    kinds = [k for k, _ in events]
    assert "requeued" not in kinds and "preempted" not in kinds
    assert any(k == "resizing" and "reclaim for tenant a" in m and "in place" in m for k, m in events)
    assert any(k == "resized" and "from 4 to 2" in m for k, m in events)
    log = b"".join(b.logs(job["id"])).decode()
    assert "resized in place to 2 workers" in log and "resized in place to 4 workers" in log
    assert "resuming" not in log
    n = int(log.split(" train / ")[0].split("; ")[-1])
    for epoch in (0, 1):
        seen = consumed(records, epoch)
        assert sorted(seen) == list(range(n)) and set(seen.values()) == {1}, f"epoch {epoch}: each sample once"
