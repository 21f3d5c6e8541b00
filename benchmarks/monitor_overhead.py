"""What monitoring costs a node: CPU per sample at the default 5 s period, against a budget of
1% of one core.

1. The sampling loop alone (``deeppod.monitor.loop.Monitor``), as the server runs it: the real
   host sampler (psutil), 8 GPUs (the fake sampler with changing readings, as this machine has
   no GPU; NVML reads are a few microseconds each), every reading attributed and written to the
   database, roll-ups and retention every 60 s of its clock. A fake clock moves 5 s per sample,
   so 1,000 samples are 83 minutes of a node's life (raw samples rolled up after an hour) run
   back to back. CPU counted: this process, plus PostgreSQL's backends for that database.
   On SQLite and on PostgreSQL.
2. The whole server, idle (no jobs), monitoring on (``DEEPPOD_MONITOR_PERIOD=5``) against off
   (``0``), interleaved: the server process's CPU seconds over the same wall time. The
   difference is monitoring's cost as users get it (on this CPU machine: the host sample).

    python benchmarks/monitor_overhead.py [--samples 1000] [--idle-seconds 90] [--rounds 2]
        [--postgres postgresql+psycopg://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
import uuid
from pathlib import Path

PERIOD = 5.0
TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _pg_backends(engine) -> list[int]:
    from sqlalchemy import text

    with engine.connect() as c:
        return list(c.execute(text("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")).scalars())


def sampling_loop(url: str, samples: int) -> dict:
    from deeppod.cluster.gpus import GpuInfo
    from deeppod.cluster.inventory import NodeInfo
    from deeppod.cluster.readings import FakeGpuSampler, OneNode, PsutilHostSampler
    from deeppod.cluster.service import register_node
    from deeppod.monitor.loop import Monitor
    from deeppod.monitor.service import Policy, count_rows
    from deeppod.store.db import make_engine, make_sessionmaker
    from deeppod.store.migrate import upgrade

    engine = make_engine(url)
    upgrade(engine)
    sessions = make_sessionmaker(engine)
    gpus = FakeGpuSampler(8, memory_total_mb=81920)
    with sessions.begin() as s:
        register_node(s, NodeInfo("node-1", "127.0.0.1", 64, 512_000, tuple(
            GpuInfo(i, f"GPU-{i}", "H100", 81920, False) for i in range(8))))
    clock = [time.time()]
    mon = Monitor(sessions, OneNode("node-1", gpus, PsutilHostSampler()), Policy(), clock=lambda: clock[0])
    rng = random.Random(0)
    mon.tick()  # the first sample pays for imports and the connection
    pg = url.startswith("postgresql")
    backends = _pg_backends(engine) if pg else []
    db_before = sum(proc_cpu(p) for p in backends if Path(f"/proc/{p}").exists())
    cpu_before, wall_before = time.process_time(), time.perf_counter()
    for _ in range(samples):
        for i in range(8):
            gpus.set(i, util=rng.uniform(0, 100), memory_used_mb=rng.uniform(0, 81920), power_w=rng.uniform(60, 700),
                     temperature_c=rng.uniform(30, 80))
        clock[0] += PERIOD
        mon.tick()
    own = time.process_time() - cpu_before
    wall = time.perf_counter() - wall_before
    db = sum(proc_cpu(p) for p in backends if Path(f"/proc/{p}").exists()) - db_before if pg else 0.0
    with sessions() as s:
        rows = count_rows(s)
    engine.dispose()
    per = (own + db) / samples
    return {"per_sample_ms": per * 1000, "own_ms": own / samples * 1000, "db_ms": db / samples * 1000,
            "wall_ms": wall / samples * 1000, "core_percent": per / PERIOD * 100, "rows": rows}


def idle_server(root: Path, seconds: float, period: float) -> float:
    from deeppod.bench.server import Server

    server = Server(root / f"home-{period}-{uuid.uuid4().hex[:6]}", {"DEEPPOD_MONITOR_PERIOD": str(period)},
                    gpus=2).start()
    try:
        time.sleep(10)  # past start-up: migrations, the first rounds
        before = proc_cpu(server.proc.pid)
        time.sleep(seconds)
        return (proc_cpu(server.proc.pid) - before) / seconds * 100
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--idle-seconds", type=float, default=90)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    args = ap.parse_args()
    import sqlalchemy as sa

    with tempfile.TemporaryDirectory(prefix="bench-monitor-") as tmp:
        root = Path(tmp)
        admin = sa.create_engine(args.postgres, isolation_level="AUTOCOMMIT")
        name = f"bench_monitor_{uuid.uuid4().hex[:8]}"
        with admin.connect() as c:
            c.execute(sa.text(f'CREATE DATABASE "{name}"'))
        try:
            loops = {"sqlite": sampling_loop(f"sqlite:///{root / 'deeppod.db'}", args.samples),
                     "postgresql": sampling_loop(args.postgres.rsplit("/", 1)[0] + "/" + name, args.samples)}
        finally:
            with admin.connect() as c:
                c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()
        on, off = [], []
        for _ in range(args.rounds):  # interleaved, so a busy moment costs both
            on.append(idle_server(root, args.idle_seconds, PERIOD))
            off.append(idle_server(root, args.idle_seconds, 0))

    print(f"\n1. the sampling loop: host (psutil) + 8 GPUs, {args.samples} samples, one every {PERIOD:.0f} s")
    print("| database | CPU per sample | of which the database | % of one core at 5 s | budget 1% -> ratio |")
    print("| --- | --- | --- | --- | --- |")
    for db, r in loops.items():
        print(f"| {db} | {r['per_sample_ms']:.2f} ms | {r['db_ms']:.2f} ms | {r['core_percent']:.3f}% "
              f"| {r['core_percent'] / 1.0:.3f}x of the budget |")
    print(f"rows kept after {args.samples * PERIOD / 60:.0f} minutes: "
          + ", ".join(f"{db} {r['rows']}" for db, r in loops.items()))
    print(f"\n2. an idle server over {args.idle_seconds:.0f} s, {args.rounds} rounds: % of one core")
    print("| monitoring on (5 s) | monitoring off | difference |")
    print("| --- | --- | --- |")
    mean_on, mean_off = sum(on) / len(on), sum(off) / len(off)
    print(f"| {mean_on:.2f}% ({', '.join(f'{x:.2f}' for x in on)}) | {mean_off:.2f}% "
          f"({', '.join(f'{x:.2f}' for x in off)}) | {mean_on - mean_off:+.2f}% of a core |")


if __name__ == "__main__":
    main()
