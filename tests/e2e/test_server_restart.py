"""Jobs outlive the server: kill -9 it mid-job, restart, and everything is accounted for."""

import sys
import time

from deeppod import Client
from deeppod.executor.local import process_start_time
from deeppod.job_folder import JobFolder
from tests.helpers import wait_until

TICKER = ("import time, os\n"
          "for i in range(40):\n"
          "    print(f'tick {i} rank {os.environ[\"RANK\"]}', flush=True)\n"
          "    time.sleep(0.2)\n"
          "print('done', flush=True)\n")


def test_kill_9_then_restart_readopts_jobs(fresh_server, tmp_path):
    server = fresh_server.start()
    c = Client(server.url, server.admin_token)
    long_job = c.submit([sys.executable, "-c", TICKER], workers=2, workdir=str(tmp_path))
    short_job = c.submit([sys.executable, "-c", "import time, sys; time.sleep(2); sys.exit(3)"],
                         workers=1, workdir=str(tmp_path))
    wait_until(lambda: all(c.job(j["id"])["state"] == "running" for j in (long_job, short_job)), 30)
    wait_until(lambda: b"tick 2 rank 1" in b"".join(c.logs(long_job["id"])), 30)

    sup = JobFolder.of(server.home / "jobs", long_job["id"]).read_supervisor()
    server.kill9()
    short_folder = JobFolder.of(server.home / "jobs", short_job["id"])
    wait_until(lambda: short_folder.read_result() is not None, 30,
               what="the short job to end while nobody is watching")
    assert process_start_time(sup["pid"]) == sup["start_time"], "the job died with the server"

    server.start()  # same home, same port
    assert "admin token" not in server.output.read_text().split("DeepPod server")[-1]  # bootstrap only once
    c = Client(server.url, server.admin_token)
    streamed = b"".join(c.logs(long_job["id"], rank=0, follow=True)).decode()
    ticks = [int(line.split()[1]) for line in streamed.splitlines() if line.startswith("tick")]
    assert ticks == list(range(40)) and streamed.rstrip().endswith("done")
    final = c.wait(long_job["id"], timeout=30)
    assert final["state"] == "succeeded" and final["exit_codes"] == {"0": 0, "1": 0}
    short = c.wait(short_job["id"], timeout=30)
    assert short["state"] == "failed"
    assert short["reason"] == "rank 0 exited with code 3" and short["exit_codes"] == {"0": 3}


def test_logs_follow_streams_live(fresh_server, tmp_path):
    server = fresh_server.start()
    c = Client(server.url, server.admin_token)
    job = c.submit([sys.executable, "-c", TICKER], workers=1, workdir=str(tmp_path))
    stamps = []
    t0 = time.monotonic()
    for chunk in c.logs(job["id"], follow=True):
        stamps.append((time.monotonic() - t0, chunk))
    text = b"".join(ch for _, ch in stamps).decode()
    assert text.count("tick") == 40 and "done" in text
    # it arrived over the job's ~8 s life, not all at the end
    assert stamps[-1][0] - stamps[0][0] > 4
