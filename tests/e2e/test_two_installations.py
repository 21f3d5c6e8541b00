"""Two DeepPod installations on one host, each sandboxing its jobs as root: their tenants with
the same id run as different OS users, and their jobs with the same id have shared memory
folders of their own, so both run side by side (issue 39: they shared a uid and a folder)."""

import sys

import pytest

from deeppod import Client
from tests.helpers import LiveServer

pytestmark = pytest.mark.slow

JOB = ("import os, time\n"
       "mark = '/dev/shm/whose'\n"
       "open(mark, 'w').write(os.environ['LABEL'])\n"
       "time.sleep(3)  # the other installation's job 1 runs meanwhile\n"
       "said = open(mark).read()\n"
       "print(f'uid {os.getuid()} shm {said}', flush=True)\n"
       "raise SystemExit(0 if said == os.environ['LABEL'] else 1)\n")


def test_two_installations_share_no_uid_and_no_shared_memory(tmp_path):
    servers = [LiveServer(tmp_path / name / "home", isolation=None) for name in ("one", "two")]
    try:
        for s in servers:
            s.start()
        clients = [Client(s.url, s.admin_token) for s in servers]
        if clients[0].whoami()["isolation"] != "sandbox":
            pytest.skip("sandboxing needs the server to run as root")
        jobs = [c.submit([sys.executable, "-c", JOB], env={"LABEL": label}, own_folder=True, gpus_per_worker=0)
                for c, label in zip(clients, ("one", "two"))]
        assert jobs[0]["id"] == jobs[1]["id"] == 1  # the same job id and tenant id on both
        done = [c.wait(j["id"], timeout=120) for c, j in zip(clients, jobs)]
        logs = [b"".join(c.logs(j["id"])).decode() for c, j in zip(clients, jobs)]
        assert [d["state"] for d in done] == ["succeeded", "succeeded"], (done, logs)
        uids = [int(log.split("uid ", 1)[1].split()[0]) for log in logs]
        assert uids[0] != uids[1] and "shm one" in logs[0] and "shm two" in logs[1], logs
    finally:
        for s in servers:
            s.stop()
            s.cleanup_jobs()
