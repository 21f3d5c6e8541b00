"""A real 2-worker DDP job through the API of a real server: it must truly all-reduce."""

import json
import shutil
import sys
from pathlib import Path

import httpx

from deeppod import Client

SCRIPT = Path(__file__).with_name("ddp_train.py")


def test_unmodified_ddp_script_all_reduces(live_server, tmp_path):
    workdir = tmp_path / "project"
    workdir.mkdir()
    shutil.copy(SCRIPT, workdir / "train.py")
    out = tmp_path / "out"
    out.mkdir()
    c = Client(live_server.url, live_server.admin_token)
    job = c.submit([sys.executable, "train.py", "6"], name="ddp", workers=2, gpus_per_worker=1,
                   env={"OUT_DIR": str(out)}, workdir=str(workdir))
    final = c.wait(job["id"], timeout=180)
    logs = b"".join(c.logs(job["id"])).decode()
    assert final["state"] == "succeeded", (final["reason"], final["exit_codes"], logs[-3000:])
    assert final["exit_codes"] == {"0": 0, "1": 0}
    r0, r1 = (json.loads((out / f"params-{r}.json").read_text()) for r in (0, 1))
    # identical parameters although every rank saw different data: gradients were all-reduced
    assert r0["params"] == r1["params"]
    # ...and training really changed them (not just equal initial weights)
    import torch

    torch.manual_seed(0)
    init = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    init_flat = torch.cat([p.detach().flatten() for p in init.parameters()]).tolist()
    assert max(abs(a - b) for a, b in zip(r0["params"], init_flat)) > 1e-3
    # the job contract
    e0, e1 = r0["env"], r1["env"]
    assert (e0["RANK"], e1["RANK"]) == ("0", "1") and e0["WORLD_SIZE"] == e1["WORLD_SIZE"] == "2"
    assert e0["LOCAL_RANK"] == "0" and e1["LOCAL_RANK"] == "1" and e0["LOCAL_WORLD_SIZE"] == "2"
    assert e0["MASTER_ADDR"] == "127.0.0.1" and e0["MASTER_PORT"] == e1["MASTER_PORT"]
    assert {e0["CUDA_VISIBLE_DEVICES"], e1["CUDA_VISIBLE_DEVICES"]} == {"0", "1"}
    assert e0["DEEPPOD_JOB_ID"] == str(job["id"]) and Path(e0["DEEPPOD_CHECKPOINT_DIR"]).is_dir()
    # the default CPU request: the node's CPUs per GPU (8 / 4), and the thread pools follow it
    assert final["cpus_per_worker"] == 2.0
    assert e0["DEEPPOD_API_URL"] == live_server.url and e0["OMP_NUM_THREADS"] == "2"
    assert r0["cwd"] == str(workdir)
    # the job's token worked while it ran and is revoked now
    assert httpx.get(live_server.url + "/v1/whoami",
                     headers={"Authorization": f"Bearer {e0['DEEPPOD_TOKEN']}"}).status_code == 401
    assert "[rank 1] rank 1 step 5" in logs


def test_failing_worker_fails_the_job_and_stops_the_other(live_server, tmp_path):
    c = Client(live_server.url, live_server.admin_token)
    code = "import os, sys, time\nif os.environ['RANK'] == '1': sys.exit(7)\ntime.sleep(120)"
    job = c.submit([sys.executable, "-c", code], workers=2, workdir=str(tmp_path))
    final = c.wait(job["id"], timeout=60)
    assert final["state"] == "failed"
    assert final["reason"] == "rank 1 exited with code 7"
    assert final["exit_codes"]["1"] == 7 and final["exit_codes"]["0"] == -15


def test_cancel_sends_sigterm_then_the_job_is_cancelled(live_server, tmp_path):
    c = Client(live_server.url, live_server.admin_token)
    code = ("import os, signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: (os.write(1, b'got SIGTERM\\n'), sys.exit(0)))\n"
            "print('started', flush=True)\n"
            "time.sleep(120)")
    job = c.submit([sys.executable, "-c", code], workers=2, workdir=str(tmp_path))
    from tests.helpers import wait_until

    wait_until(lambda: b"".join(c.logs(job["id"])).count(b"started") == 2, 60, what="both workers to start")
    c.cancel(job["id"])
    final = c.wait(job["id"], timeout=30)
    assert final["state"] == "cancelled"
    assert b"".join(c.logs(job["id"])).count(b"got SIGTERM") == 2
