"""A failover control plane: two real servers on one PostgreSQL database, kill -9 of the
leader while jobs run, and a leader that was frozen and comes back after a takeover."""

import signal
import sys
import time

import httpx

from deeppod import Client
from tests.helpers import LiveServer, wait_until

# reports a metric through deeppod.runtime every step, so the job must keep reaching the
# control plane after the server it was started by is gone
TRAINER = ("import os, time\n"
           "from deeppod.runtime import report\n"
           "for step in range(STEPS):\n"
           "    print(f'tick {step} rank {os.environ[\"RANK\"]}', flush=True)\n"
           "    if os.environ['RANK'] == '0':\n"
           "        report(step, loss=1.0 / (step + 1))\n"
           "    time.sleep(0.25)\n"
           "print('done', flush=True)\n")


def health(server: LiveServer) -> dict:
    return httpx.get(server.url + "/healthz", timeout=2).json()


def started_events(c: Client, job_id: int) -> int:
    return sum(e["kind"] == "started" for e in c.events(job_id))


def test_kill_9_of_the_leader_then_a_frozen_leader_comes_back(tmp_path, pg_url):
    home = tmp_path / "home"
    env = {"DEEPPOD_DATABASE_URL": pg_url}
    a = LiveServer(home, extra_env=env).start()
    b = LiveServer(home, extra_env=env)
    try:
        b.start()
        assert health(a)["leader"] and not health(b)["leader"]
        assert "control plane: standby" in b.output.read_text()
        c = Client(f"{a.url},{b.url}", a.admin_token)
        assert {(s["url"], s["leader"]) for s in c.servers()} == {(a.url, True), (b.url, False)}
        # the leader's next heartbeat sees b: from then on it tells jobs every server, itself first
        wait_until(lambda: health(a)["live_servers"] == 2, 15, interval=0.1, what="the leader to see the standby")
        long_job = c.submit([sys.executable, "-c", TRAINER.replace("STEPS", "60")], workers=2, workdir=str(tmp_path))
        wait_until(lambda: b"tick 3 rank 1" in b"".join(c.logs(long_job["id"])), 60, what="the job to run")

        a.kill9()
        killed = time.monotonic()
        # the client goes to the server that answers; a job submitted now waits for the new leader
        waiting = c.submit([sys.executable, "-c", "print('second')"], workers=1, workdir=str(tmp_path))
        assert c.url == b.url
        wait_until(lambda: health(b)["leader"], 15, interval=0.1, what="the standby to lead")
        led_after = time.monotonic() - killed
        assert led_after < 10, f"the standby led {led_after:.1f} s after the kill"
        assert c.wait(waiting["id"], timeout=30)["state"] == "succeeded"

        final = c.wait(long_job["id"], timeout=60)
        assert final["state"] == "succeeded" and final["exit_codes"] == {"0": 0, "1": 0}
        assert final["restart_count"] == 0 and started_events(c, long_job["id"]) == 1  # adopted, not restarted
        ticks = [int(line.split()[1]) for line in b"".join(c.logs(long_job["id"], rank=0)).decode().splitlines()
                 if line.startswith("tick")]
        assert ticks == list(range(60))
        metrics = c.metrics(long_job["id"])
        assert "loss" in metrics["metrics"], metrics
        loss = metrics["metrics"]["loss"]["series"]
        assert [step for step, _ in loss] == list(range(60))  # the steps reported while no server led, too

        # a frozen leader (a long pause, a cut link) that comes back after a takeover acts no more
        a.start()  # the old leader's place: a standby now
        assert not health(a)["leader"]
        b.proc.send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: health(a)["leader"], 15, interval=0.1, what="a to take over from the frozen b")
            c = Client(f"{a.url},{b.url}", a.admin_token)
            third = c.submit([sys.executable, "-c", TRAINER.replace("STEPS", "12")], workers=1, workdir=str(tmp_path))
            wait_until(lambda: c.job(third["id"])["state"] == "running", 30)
        finally:
            b.proc.send_signal(signal.SIGCONT)
        wait_until(lambda: not health(b)["leader"], 15, what="the old leader to step down")
        assert health(a)["leader"]
        done = c.wait(third["id"], timeout=60)
        assert done["state"] == "succeeded" and done["restart_count"] == 0 and started_events(c, third["id"]) == 1
        assert "stepping down" in b.output.read_text() or "lost the lead" in b.output.read_text()
        epochs = {s["url"]: s["epoch"] for s in c.servers() if s["leader"]}
        assert epochs == {a.url: 3}
    finally:
        for server in (a, b):
            if server.proc and server.proc.poll() is None:
                server.proc.send_signal(signal.SIGCONT)
            server.stop()
        a.cleanup_jobs()
