"""The control plane under load: a real `deeppod server --gpus 1` (the defaults a user gets)
with 10,000 jobs in its database, and a load generator on the same machine (httpx, async,
keep-alive connections, one per simulated client), on SQLite (the embedded default) and on
PostgreSQL (--database-url):

- readers: N concurrent clients, each alternating a page of 50 jobs (GET /v1/jobs?limit=50)
  and a job's details (GET /v1/jobs/ID), for --seconds per level, in --rounds rounds: polling
  (a request, then --think seconds; the console polls every 2-5 s) at --levels, and back to
  back (as fast as answers come: what the machine can serve) at --saturate;
- submitters: 16 concurrent clients submitting jobs (queued behind the one GPU);
- /healthz probed 20 times a second throughout, from a process of its own (--probe);
- the floor: a bare FastAPI + SQLAlchemy app (benchmarks/api_floor.py) doing the same two
  queries on the same database under the same reader load; the ratio is printed.

Errors are any answer >= 500 other than 503 and any dropped connection; 503s (the server
shedding load, with Retry-After) are counted apart. Leadership changes are read from the
server's log.

    python benchmarks/api_load.py [--jobs 10000] [--levels 10,50,100] [--think 1] [--saturate 16,100]
                                  [--seconds 10] [--rounds 2] [--submits 1500] [--storm 100]
                                  [--databases sqlite,postgresql] [--probe process|loop] [--no-floor]
                                  [--server-env DEEPPOD_X=V ...]
    python benchmarks/api_load.py --soak 600      # 30 console users and a 16-way search
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PG_ADMIN = os.environ.get("DEEPPOD_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@dataclass
class Tally:
    times: list[float] = field(default_factory=list)
    errors: int = 0
    shed: int = 0  # 503: the server said to come back (Retry-After)
    said: dict[str, int] = field(default_factory=dict)

    def add(self, began: float, status: int | None, why: str = "") -> None:
        if status is None or (status >= 500 and status != 503):
            self.errors += 1
            key = why or str(status)
            self.said[key] = self.said.get(key, 0) + 1
        elif status == 503:
            self.shed += 1
        else:
            self.times.append(time.perf_counter() - began)

    def p(self, q: float) -> float:
        if not self.times:
            return float("nan")
        ordered = sorted(self.times)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def fill(url: str, home: Path, jobs: int) -> None:
    """``jobs`` finished jobs of the admin, written straight into the database."""
    from sqlalchemy import insert

    from deeppod.contract import JobState
    from deeppod.store import sealed
    from deeppod.store.db import make_engine
    from deeppod.store.models import Job

    sealed.configure((home / "secret.key").read_bytes().strip())
    engine = make_engine(url)
    with engine.begin() as c:
        for start in range(0, jobs, 2000):
            c.execute(insert(Job), [{"name": f"resnet-{i % 97}", "tenant_id": 1, "user_id": 1,
                                     "command": ["python", "train.py"], "workdir": "/tmp",
                                     "state": JobState.SUCCEEDED if i % 3 else JobState.FAILED,
                                     "gpus_per_worker": 1, "workers": 1 + i % 4}
                                    for i in range(start, min(jobs, start + 2000))])
    engine.dispose()


async def _get(client: httpx.AsyncClient, tally: Tally, path: str) -> None:
    began = time.perf_counter()
    try:
        r = await client.get(path)
        tally.add(began, r.status_code)
    except httpx.HTTPError as exc:
        tally.add(began, None, type(exc).__name__)


async def readers(url: str, headers: dict, clients: int, seconds: float, ids: int, think: float = 0.0) -> Tally:
    """``clients`` each asking, then waiting ``think`` seconds (a console polls every 2-5 s;
    0: as fast as answers come, the saturation test). Each client's connection is made, and
    its first answer had, before the measured ``seconds`` begin (keep-alive: steady state)."""
    tally = Tally()
    ready = asyncio.Event()
    connected = [0]
    end = [0.0]

    async def one(n: int) -> None:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60,
                                     limits=httpx.Limits(max_connections=1)) as c:
            await _get(c, Tally(), f"/v1/jobs/{random.randint(1, ids)}")
            connected[0] += 1
            if connected[0] == clients:
                end[0] = time.perf_counter() + seconds
                ready.set()
            await ready.wait()
            i = n
            if think:
                await asyncio.sleep(random.uniform(0, think))  # not all at once
            while time.perf_counter() < end[0]:
                i += 1
                await _get(c, tally, "/v1/jobs?limit=50" if i % 2 else f"/v1/jobs/{random.randint(1, ids)}")
                if think:
                    await asyncio.sleep(think * random.uniform(0.8, 1.2))

    await asyncio.gather(*(one(n) for n in range(clients)))
    return tally


async def storm(url: str, headers: dict, clients: int, waves: int, ids: int) -> tuple[Tally, float]:
    """A thundering start: ``clients`` new connections in the same instant (a class opening
    the console at 9:00, a search's workers starting together), each asking for a job;
    ``waves`` times, a new connection each. The time counts from before the connection is
    made to the answer; also returned: the seconds the waves took."""
    tally, took = Tally(), 0.0

    async def one(go: asyncio.Event) -> None:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as c:
            await go.wait()
            await _get(c, tally, f"/v1/jobs/{random.randint(1, ids)}")

    for _ in range(waves):
        go = asyncio.Event()
        tasks = [asyncio.create_task(one(go)) for _ in range(clients)]
        await asyncio.sleep(0.2)  # every client is set up and waiting
        began = time.perf_counter()
        go.set()
        await asyncio.gather(*tasks)
        took += time.perf_counter() - began
    return tally, took


async def submitters(url: str, headers: dict, clients: int, total: int) -> tuple[Tally, float]:
    tally = Tally()
    left = [total]
    body = {"command": ["python", "-c", "import time; time.sleep(3600)"], "gpus_per_worker": 1}

    async def one() -> None:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60,
                                     limits=httpx.Limits(max_connections=1)) as c:
            while left[0] > 0:
                left[0] -= 1
                began = time.perf_counter()
                try:
                    r = await c.post("/v1/jobs", json=body)
                    tally.add(began, r.status_code if r.status_code != 201 else 200, r.text[:80])
                except httpx.HTTPError as exc:
                    tally.add(began, None, type(exc).__name__)

    began = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(clients)))
    return tally, time.perf_counter() - began


async def with_probe(url: str, work, how: str = "process"):
    """Run ``work`` while /healthz is asked 20 times a second; (work's result, the probe's tally).

    ``how`` (``--probe``): "process", the default, asks from a process of its own, as a load
    balancer's health check does; "loop" asks from the load generator's own event loop (the
    figures before session 12), where the times also held the generator's wait for its
    loop, busy with 100 clients of its own."""
    if how == "loop":
        return await _with_loop_probe(url, work)
    proc = await asyncio.create_subprocess_exec(sys.executable, __file__, "--probe-only", url,
                                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    await proc.stdout.readline()  # "ready": its first answer is had
    try:
        result = await work
    finally:
        proc.stdin.close()
        out, _ = await proc.communicate()
    probe = Tally()
    for line in out.decode().splitlines():
        status, seconds, why = line.split(" ", 2)
        probe.add(time.perf_counter() - float(seconds), None if status == "-" else int(status), why)
    return result, probe


def probe_only(url: str) -> None:
    """--probe-only URL: ask /healthz 20 times a second until stdin closes; print one line an
    answer (status, seconds, error)."""
    import threading

    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    lines = []
    with httpx.Client(base_url=url, timeout=60) as c:
        c.get("/healthz")
        print("ready", flush=True)
        while not stop.is_set():
            began = time.perf_counter()
            try:
                status, why = c.get("/healthz").status_code, ""
            except httpx.HTTPError as exc:
                status, why = "-", type(exc).__name__
            lines.append(f"{status} {time.perf_counter() - began:.6f} {why}")
            stop.wait(0.05)
    print("\n".join(lines), flush=True)


async def _with_loop_probe(url: str, work):
    probe = Tally()
    done = asyncio.Event()

    async def probing() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            while not done.is_set():
                await _get(c, probe, "/healthz")
                await asyncio.sleep(0.05)

    task = asyncio.create_task(probing())
    try:
        result = await work
    finally:
        done.set()
        await task
    return result, probe


def row(what: str, t: Tally, seconds: float) -> str:
    n = len(t.times)
    return (f"{what:44} {n / seconds:8.0f} {t.p(0.5):8.1f} {t.p(0.95):8.1f} {t.p(0.99):8.1f} {t.errors:6d} "
            f"{t.shed:6d}" + (f"  {t.said}" if t.said else ""))


HEAD = f"{'':44} {'req/s':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'errors':>6} {'503':>6}"


def cpu_seconds(names: tuple[str, ...]) -> float:
    """CPU time (user + system) of every process whose name is one of ``names`` (PostgreSQL's
    backends run as another user; /proc/PID/stat is readable all the same)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            raw = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        name, rest = raw[raw.index("(") + 1:raw.rindex(")")], raw[raw.rindex(")") + 2:].split()
        if name in names:
            total += int(rest[11]) + int(rest[12])
    return total / tick


def process_cpu(pid: int) -> float:
    rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def leader_changes(log: Path) -> int:
    text = log.read_text(errors="replace") if log.exists() else ""
    return text.count("stepping down") + text.count("lost the lead")


def pg_database() -> tuple[str, callable]:
    import sqlalchemy as sa

    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    name = f"deeppod_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return admin.url.set(database=name).render_as_string(hide_password=False), drop


def run_database(kind: str, a) -> dict:
    from tests.helpers import LiveServer, free_port

    drop = None
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        env = {"DEEPPOD_RECONCILE_INTERVAL": "0.5",  # the default (tests' servers poll faster)
               **dict(kv.split("=", 1) for kv in a.server_env)}
        if kind == "postgresql":
            db_url, drop = pg_database()
            env["DEEPPOD_DATABASE_URL"] = db_url
        else:
            db_url = f"sqlite:///{home / 'deeppod.db'}"
        server = LiveServer(home, gpus=1, extra_env=env, isolation=None).start()
        out: dict = {}
        try:
            server.stop()  # fill the database while nothing else writes to it
            fill(db_url, home, a.jobs)
            server.start()
            headers = {"Authorization": f"Bearer {server.admin_token}"}
            print(f"\n== {kind}: {a.jobs} jobs; deeppod server {server.url} (--gpus 1) ==", flush=True)
            print(HEAD)
            for level, think in a.loads:
                for n in range(a.rounds):
                    t, probe = asyncio.run(with_probe(server.url, readers(server.url, headers, level, a.seconds,
                                                                          a.jobs, think), a.probe))
                    print(row(f"deeppod {_load(level, think)} (round {n + 1})", t, a.seconds), flush=True)
                    print(row("  /healthz meanwhile", probe, a.seconds), flush=True)
                    out[("deeppod", level, think, n)] = t
            if a.storm:
                (t, took), probe = asyncio.run(with_probe(server.url, storm(server.url, headers, a.storm,
                                                                            a.rounds * 3, a.jobs), a.probe))
                print(row(f"deeppod {a.storm} connecting at once ({a.rounds * 3} waves)", t, took), flush=True)
                print(row("  /healthz meanwhile", probe, took), flush=True)
                out["storm"] = t
            if a.submits:
                before = leader_changes(server.output)
                cpu = process_cpu(server.proc.pid), cpu_seconds(("postgres",)), sum(os.times()[:2])
                (t, took), probe = asyncio.run(with_probe(server.url, submitters(server.url, headers, 16, a.submits),
                                                                 a.probe))
                print(row(f"deeppod submitters x16 ({a.submits} submits)", t, took), flush=True)
                ms = [1000 * (now - was) / max(1, len(t.times)) for now, was in
                      zip((process_cpu(server.proc.pid), cpu_seconds(("postgres",)), sum(os.times()[:2])), cpu)]
                print(f"  CPU per submit: server {ms[0]:.1f} ms, postgres {ms[1]:.1f} ms, "
                      f"load generator {ms[2]:.1f} ms",
                      flush=True)
                print(row("  /healthz meanwhile", probe, took), flush=True)
                changes = leader_changes(server.output) - before
                print(f"  submits/s {len(t.times) / took:.0f}; leadership changes during the burst: {changes}",
                      flush=True)
                out["submits"] = (len(t.times) / took, t.errors, changes)
        finally:
            server.stop()
            server.cleanup_jobs()
        if a.no_floor:
            if drop:
                drop()
            return out
        port = free_port()
        floor = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "api_floor.py"), db_url, str(port),
                                  str(home / "secret.key")])
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(100):
                try:
                    if httpx.get(url + "/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            for level, think in a.loads:
                for n in range(a.rounds):
                    t = asyncio.run(readers(url, {}, level, a.seconds, a.jobs, think))
                    print(row(f"floor {_load(level, think)} (round {n + 1})", t, a.seconds), flush=True)
                    out[("floor", level, think, n)] = t
            if a.storm:
                t, took = asyncio.run(storm(url, {}, a.storm, a.rounds * 3, a.jobs))
                print(row(f"floor {a.storm} connecting at once ({a.rounds * 3} waves)", t, took), flush=True)
                out["floor storm"] = t
        finally:
            floor.terminate()
            floor.wait()
            if drop:
                drop()
        print(f"-- {kind}: deeppod vs the floor (a bare FastAPI + SQLAlchemy app, same queries, same data)")
        for level, think in a.loads:
            ours = [out[("deeppod", level, think, n)] for n in range(a.rounds)]
            base = [out[("floor", level, think, n)] for n in range(a.rounds)]
            rate = statistics.mean(len(t.times) for t in ours) / max(1, statistics.mean(len(t.times) for t in base))
            p95 = statistics.mean(t.p(0.95) for t in ours) / statistics.mean(t.p(0.95) for t in base)
            print(f"   {_load(level, think)}: throughput {rate:.2f} of the floor's; p95 {p95:.2f}x the floor's; "
                  f"deeppod p95 {statistics.mean(t.p(0.95) for t in ours):.0f} ms, errors "
                  f"{sum(t.errors for t in ours)}, 503 {sum(t.shed for t in ours)}")
        if a.storm:
            ours, base = out["storm"], out["floor storm"]
            print(f"   {a.storm} connecting at once: p95 {ours.p(0.95):.0f} ms ({ours.p(0.95) / base.p(0.95):.2f}x the "
                  f"floor's), max {ours.p(1.0):.0f} ms, errors {ours.errors}, 503 {ours.shed}")
        return out


def _load(clients: int, think: float) -> str:
    return f"readers x{clients}, {think:g} s apart" if think else f"readers x{clients}, back to back"


TRIAL = ("import time\nfrom deeppod.runtime import report\n"
         "for step in range(3):\n    report(step, loss=float('{lr}') / (step + 1))\n    time.sleep(0.5)\n")


def vitals(pid: int, db_url: str) -> dict:
    """The server process's memory, open descriptors and threads; its database connections."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    fds = os.listdir(f"/proc/{pid}/fd")
    rollup = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])
    out = {"rss_mb": int(status["VmRSS"].split()[0]) // 1024,
           "anon_mb": int(rollup["Anonymous"].split()[0]) // 1024,  # the heap: what the process made, not files
           "fds": len(fds), "threads": int(status["Threads"])}
    if db_url.startswith("sqlite"):
        db = db_url.split("///", 1)[1]
        out["db_files_open"] = sum(os.path.realpath(f"/proc/{pid}/fd/{fd}").startswith(db) for fd in fds
                                   if os.path.exists(f"/proc/{pid}/fd/{fd}"))
    else:
        import sqlalchemy as sa

        engine = sa.create_engine(db_url)
        with engine.connect() as c:
            out["db_connections"] = c.execute(sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name LIKE 'deeppod-%'")).scalar()
        engine.dispose()
    return out


async def console_users(url: str, token: str, users: int, seconds: float, job_id: int, tally: Tally) -> None:
    """Signed-in console tabs polling as the pages do: half on the jobs list (every 5 s), half
    on a job's page (its status and log every 2 s, its events every 3 s)."""
    end = time.perf_counter() + seconds

    async def user(n: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            r = await c.post("/login", data={"token": token, "next": "/jobs"})
            assert r.status_code == 303, r.text
            await asyncio.sleep(random.uniform(0, 2))
            tick = 0
            while time.perf_counter() < end:
                if n % 2:
                    await _get_html(c, tally, "/jobs", {"HX-Request": "true", "HX-Target": "jobs-table"})
                    await asyncio.sleep(5)
                else:
                    await _get_html(c, tally, f"/jobs/{job_id}/status", {"HX-Request": "true"})
                    await _get_html(c, tally, f"/jobs/{job_id}/log?rank=0", {"HX-Request": "true"})
                    if tick % 3 == 0:
                        await _get_html(c, tally, f"/jobs/{job_id}/events", {"HX-Request": "true"})
                    tick += 2
                    await asyncio.sleep(2)

    await asyncio.gather(*(user(n) for n in range(users)))


async def _get_html(client: httpx.AsyncClient, tally: Tally, path: str, headers: dict) -> None:
    began = time.perf_counter()
    try:
        r = await client.get(path, headers=headers)
        tally.add(began, r.status_code)
    except httpx.HTTPError as exc:
        tally.add(began, None, type(exc).__name__)


def soak(a) -> None:
    """30 console users and a 16-way search for --soak seconds: memory, descriptors, threads
    and database connections at the start (after a minute's warm-up) and at the end."""
    from tests.helpers import LiveServer

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        db_url = f"sqlite:///{home / 'deeppod.db'}"
        server = LiveServer(home, gpus=1, extra_env={"DEEPPOD_RECONCILE_INTERVAL": "0.5"}, isolation=None).start()
        try:
            server.stop()
            fill(db_url, home, a.jobs)
            server.start()
            token = server.admin_token
            api = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
            r = api.post("/v1/experiments", json={
                "name": "soak", "space": {"lr": {"type": "float", "low": 0.001, "high": 0.1, "log": True}},
                "metric": "loss", "mode": "min", "trials": 10_000, "parallel": 16, "sampler": "random",
                "pruner": "none", "job": {"command": ["python", "-c", TRIAL], "gpus_per_worker": 0,
                                          "cpus_per_worker": 0.25}})
            assert r.status_code == 201, r.text
            pid = server.proc.pid
            print(f"soak: {a.soak:.0f} s, 30 console users and a 16-way search; server {server.url} (pid {pid})")
            tally = Tally()

            async def run() -> list[dict]:
                seen = []

                async def sample() -> None:
                    await asyncio.sleep(60)
                    while True:
                        seen.append(vitals(pid, db_url))
                        print(f"  {time.strftime('%H:%M:%S')} {seen[-1]}", flush=True)
                        await asyncio.sleep(30)

                watcher = asyncio.create_task(sample())
                await console_users(server.url, token, 30, a.soak, a.jobs + 1, tally)
                watcher.cancel()
                seen.append(vitals(pid, db_url))
                return seen

            seen = asyncio.run(run())
            counts = api.get("/v1/experiments/soak").json().get("counts", {})
            for job in api.get("/v1/jobs", params={"kind": "trial", "state": "failed", "limit": 5}).json():
                print(f"  a failed trial: job {job['id']}: {job.get('reason')}")
            api.post("/v1/experiments/soak/stop")
            print(HEAD)
            print(row("console polls", tally, a.soak))
            print(f"trials: {counts}; start {seen[0]}; end {seen[-1]}")
            grew = {k: (seen[-1][k], seen[0][k]) for k in seen[0] if seen[-1][k] > seen[0][k] * 1.2 + 5}
            print("flat" if not grew else f"grew: {grew}")
        finally:
            server.stop()
            server.cleanup_jobs()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--levels", default="10,50,100", help="readers polling (each asks, then waits --think s)")
    ap.add_argument("--think", type=float, default=1.0, help="seconds a polling reader waits between requests")
    ap.add_argument("--saturate", default="16,100", help="readers asking back to back (the saturation test)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--submits", type=int, default=1500)
    ap.add_argument("--storm", type=int, default=100, help="clients connecting in the same instant (0: none)")
    ap.add_argument("--server-env", action="append", default=[], metavar="DEEPPOD_X=V",
                    help="a setting for the DeepPod server (repeatable), e.g. DEEPPOD_API_CONCURRENCY=8")
    ap.add_argument("--no-floor", action="store_true", help="measure DeepPod only (settings compared side by side)")
    ap.add_argument("--databases", default="sqlite,postgresql")
    ap.add_argument("--soak", type=float, default=0.0, help="seconds of 30 console users and a 16-way search")
    ap.add_argument("--probe", choices=("process", "loop"), default="process",
                    help="ask /healthz from a process of its own, or from the load generator's event loop")
    ap.add_argument("--probe-only", metavar="URL", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.probe_only:
        probe_only(a.probe_only)
        return
    a.loads = [(int(x), a.think) for x in a.levels.split(",") if x] + \
        [(int(x), 0.0) for x in a.saturate.split(",") if x]
    print(f"machine: {os.cpu_count()} CPUs; python {sys.version.split()[0]}")
    if a.soak:
        soak(a)
        return
    for kind in a.databases.split(","):
        run_database(kind, a)


if __name__ == "__main__":
    main()
