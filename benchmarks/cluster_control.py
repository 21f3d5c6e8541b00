"""Many machines: how long a job takes to start on a Ray cluster next to this machine alone,
and how long the control plane is without a leader after kill -9 of the leader.

1. start: a 2-worker job (one GPU each) from ``POST /v1/jobs`` to both workers running their
   first line of Python, on a local-executor server (one machine, 2 logical GPUs) and on a
   Ray-executor server (a warm Ray cluster on this machine: a head and two raylets with one
   logical GPU each, so the job spans two Ray nodes). Aim: Ray within 2 s of local.
2. failover: two servers on one PostgreSQL database; kill -9 of the leader, then at once a
   job submitted to the standby; time to the standby leading and to that job's start (the
   new leader's first decision). Repeated with the roles swapped. Aim: under 10 s.

    python benchmarks/cluster_control.py [--repeat 7] [--failovers 4]
        [--postgres postgresql+psycopg://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from deeppod import Client
from deeppod.bench.ray_cluster import LocalRayCluster
from deeppod.bench.server import Server

MARK = ("import os, time; d = os.environ['DEEPPOD_CHECKPOINT_DIR']; "
        "open(os.path.join(d, 'up-' + os.environ['RANK']), 'w').close(); time.sleep(1)")


def time_to_running(server: Server, workdir: Path, workers: int = 2) -> float:
    """From the submit call to every worker's first line of Python."""
    c = Client(server.url, (server.home / "admin.token").read_text().strip())
    began = time.perf_counter()
    job = c.submit([sys.executable, "-c", MARK], workers=workers, gpus_per_worker=1, workdir=str(workdir))
    marks = [server.home / "jobs" / str(job["id"]) / "checkpoints" / f"up-{r}" for r in range(workers)]
    while not all(m.exists() for m in marks):
        if time.perf_counter() - began > 120:
            raise RuntimeError(f"job {job['id']} did not start: {c.job(job['id'])['reason']}")
        time.sleep(0.005)
    took = time.perf_counter() - began
    c.wait(job["id"], timeout=60)
    return took


def bench_start(repeat: int, root: Path) -> dict:
    cluster = LocalRayCluster()
    servers = []
    try:
        for _ in range(2):
            cluster.add_node()
        local = Server(root / "local", {}).start()
        servers.append(local)
        on_ray = Server(root / "ray", {"DEEPPOD_EXECUTOR": "ray", "DEEPPOD_RAY_ADDRESS": cluster.address,
                                       **cluster.client_env}).start()
        servers.append(on_ray)
        for s in servers:  # warm: the first job of each pays for imports and Ray's first workers
            time_to_running(s, root)
        runs = {"local": [], "ray": []}
        for _ in range(repeat):  # interleaved, so a busy moment costs both
            runs["local"].append(time_to_running(local, root))
            runs["ray"].append(time_to_running(on_ray, root))
        return {k: sorted(v) for k, v in runs.items()}
    finally:
        for s in servers:
            s.stop()
        cluster.stop()


def bench_failover(rounds: int, root: Path, pg_admin: str) -> dict:
    import sqlalchemy as sa

    admin = sa.create_engine(pg_admin, isolation_level="AUTOCOMMIT")
    name = f"deeppod_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = admin.url.set(database=name).render_as_string(hide_password=False)
    env = {"DEEPPOD_DATABASE_URL": url}
    home = root / "ha"
    servers = [Server(home, env).start()]
    servers.append(Server(home, env).start())
    leads, decides = [], []
    try:
        for _ in range(rounds):
            leader, standby = (servers if servers[0].health()["leader"] else servers[::-1])
            time.sleep(1.5)  # a steady state: the standby has heartbeaten, the leader renewed
            token = (home / "admin.token").read_text().strip()
            c = Client(f"{standby.url},{leader.url}", token)
            leader.kill9()
            killed = time.perf_counter()
            job = c.submit([sys.executable, "-c", "pass"], workers=1, workdir=str(root))
            led = None
            while True:
                now = time.perf_counter()
                if led is None and standby.health()["leader"]:
                    led = now - killed
                if c.job(job["id"])["state"] != "queued":
                    decided = now - killed
                    break
                if now - killed > 60:
                    raise RuntimeError("no leader within 60 s")
                time.sleep(0.02)
            leads.append(led if led is not None else decided)
            decides.append(decided)
            leader.start()  # back as the standby for the next round
        return {"led": sorted(leads), "decided": sorted(decides)}
    finally:
        for s in servers:
            s.stop()
        with admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--failovers", type=int, default=4)
    ap.add_argument("--postgres", default=os.environ.get("DEEPPOD_TEST_POSTGRES_URL",
                                                         "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    ap.add_argument("--skip-failover", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dpbench") as tmp:
        root = Path(tmp)
        start = bench_start(args.repeat, root)
        med = {k: statistics.median(v) for k, v in start.items()}
        print(f"submit -> 2 workers running, median of {args.repeat}: local {med['local']:.2f} s, "
              f"Ray (2 nodes) {med['ray']:.2f} s; Ray - local = {med['ray'] - med['local']:+.2f} s, "
              f"ratio {med['ray'] / med['local']:.2f}x")
        out = {"start_s": start}
        if not args.skip_failover:
            fo = bench_failover(args.failovers, root, args.postgres)
            print(f"failover, median of {args.failovers}: kill -9 -> standby leads {statistics.median(fo['led']):.2f} "
                  f"s "
                  f"(max {max(fo['led']):.2f}); -> its first decision {statistics.median(fo['decided']):.2f} s "
                  f"(max {max(fo['decided']):.2f}); aim < 10 s")
            out["failover_s"] = fo
        print(json.dumps(out))


if __name__ == "__main__":
    main()
