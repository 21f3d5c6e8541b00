"""Inference serving, four ways, same model, same image, same closed-loop load, one run:

- DeepPod through the control plane's public predict endpoint (auth, least-loaded routing,
  retries), as users call it;
- DeepPod with a direct token (``POST /v1/deployments/NAME/direct``): the client calls the
  replica itself, which checks the token the control plane signed (serve/direct.py);
- the same DeepPod replica hit directly with its platform secret (what the hop costs);
- plain FastAPI + torch, one request per forward pass (deeppod.bench.plain_server);
- Ray Serve with @serve.batch (benchmarks/ray_serve_app.py), when --ray-python names a Python
  with ray[serve] (its own environment: ``python -m venv E && E/bin/pip install "ray[serve]"``).

Systems are interleaved: in each round, at each concurrency, every system runs ``--slices``
times for duration/slices seconds, taking turns with the others, in turned order every other
round (Ray Serve, started for its turn only, runs after the others); the figures are the
median over rounds. Aims (issues 18, 45): the platform path at >= 0.95x
the direct replica at c=1, 8 and 32 in the worst round (the proxied hop and the direct token
are both shown), and its p99 at c=1 within 5 ms of plain FastAPI's.

    python benchmarks/infer_throughput.py [--model mobilenet_v3_small] [--concurrency 1,8,32]
        [--duration 15] [--rounds 4] [--cpus-per-replica 1] [--ray-python PATH] [--out FILE]

``--cpus-per-replica`` defaults to what ``deeppod deploy`` gives a replica (1 CPU); Ray Serve's
replica gets as many (``num_cpus``), plain FastAPI torch's default threads (every core).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from deeppod.bench.infer import PlainServer, closed_loop, export_model, merged
from deeppod.bench.server import Server
from deeppod.bench.spread import LoadMeter, Spread, machine
from deeppod.contract import ENV_REPLICA_SECRET, REPLICA_SECRET_HEADER, free_port

ROOT = Path(__file__).resolve().parents[1]


def jpeg(size: int = 224) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.effect_noise((size, size), 64).convert("RGB").save(buf, "JPEG", quality=90)
    return buf.getvalue()


def wait_http(url: str, proc: subprocess.Popen | None, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited ({proc.returncode})")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer in {seconds:.0f} s")


def start_ray(python: str, model_dir: Path, cpus: float, max_batch: int, max_wait_ms: float, log: Path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEEPPOD_", "RAY_"))}
    env["PYTHONPATH"] = str(ROOT / "src")  # its workers decode with deeppod.runtime, as the others do
    env["RAY_AUTH_MODE"] = "disabled"  # else Ray 2.60 writes ~/.ray/auth_token, which other Ray clusters then expect
    proc = subprocess.Popen([python, str(ROOT / "benchmarks" / "ray_serve_app.py"), str(model_dir), str(port),
                             f"{cpus:g}", str(max_batch), f"{max_wait_ms:g}"], env=env, stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 300
    while b"ready" not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("Ray Serve did not start: " + log.read_text()[-3000:])
        time.sleep(0.5)
    return proc, f"http://127.0.0.1:{port}/predict"


def serving_processes(name: str, server: Server, plain: PlainServer | None) -> dict:
    """The processes whose CPU a request costs, by role (Ray Serve's are many: not counted)."""
    import psutil

    replica = [p for p in psutil.process_iter(["cmdline"]) if "deeppod.serve.replica" in (p.info["cmdline"] or [])]
    if name in ("platform", "direct"):  # direct: the control plane takes the replicas' syncs
        return {"control_plane": [psutil.Process(server.proc.pid)], "replica": replica}
    if name == "replica":
        return {"replica": replica}
    if name == "fastapi" and plain is not None:
        return {"server": [psutil.Process(plain.proc.pid)]}
    return {}


def cpu_seconds(procs: dict) -> dict:
    out = {}
    for role, ps in procs.items():
        total = 0.0
        for p in ps:
            try:
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except Exception:  # noqa: BLE001 - a process that ended
                pass
        out[role] = total
    return out


def stop_ray(proc: subprocess.Popen) -> None:
    """Its process group: the driver and the Ray cluster it started."""
    try:
        os.killpg(proc.pid, 2)  # the driver shuts Serve and Ray down
        proc.wait(60)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, 9)  # what is left of the cluster (raylet, workers)
    except ProcessLookupError:
        pass
    proc.wait()


def time_revocation(url: str, auth: dict, body: bytes) -> float:
    """Milliseconds from revoking a deployment key to its direct token being refused."""
    key = httpx.post(f"{url}/v1/deployments/bench/keys", json={"name": "revocation"}, headers=auth, timeout=30).json()
    grant = httpx.post(f"{url}/v1/deployments/bench/direct", headers={"X-DeepPod-Key": key["key"]}, timeout=30).json()
    target = grant["replicas"][0]["url"] + "/predict"
    headers = {"Authorization": f"Bearer {grant['token']}", "content-type": "image/jpeg"}
    if httpx.post(target, content=body, headers=headers, timeout=30).status_code != 200:
        raise SystemExit("the key's direct token was refused before the key was revoked")
    httpx.delete(f"{url}/v1/deployments/bench/keys/{key['id']}", headers=auth, timeout=30).raise_for_status()
    began = time.monotonic()
    while httpx.post(target, content=b"", headers=headers, timeout=30).status_code != 401:
        if time.monotonic() - began > 10:
            raise SystemExit("the revoked key's direct token still works after 10 s")
        time.sleep(0.005)
    return 1000 * (time.monotonic() - began)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mobilenet_v3_small")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--cpus-per-replica", type=float, default=1.0,
                    help="CPUs of the DeepPod and Ray Serve replicas (default: deeppod deploy's, 1)")
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds per system, concurrency and round")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--slices", type=int, default=4, help="turns each system takes per round and concurrency "
                                                          "(the others' between them)")
    ap.add_argument("--ray-python", default=None, help="a Python with ray[serve] installed (its own venv)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "infer_cpu.json")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    home = Path(tempfile.mkdtemp(prefix="deeppod-bench-infer-"))
    body = jpeg(args.image_size)
    export_model(home / "artifact", args.model, args.image_size)

    meter = LoadMeter()
    print(machine())
    server = Server(home / "server").start()
    plain = ray = None
    try:
        env = {**server.env, "DEEPPOD_API_URL": server.url, "DEEPPOD_TOKEN": server.admin_token}
        cli = [sys.executable, "-m", "deeppod.cli"]
        subprocess.run([*cli, "models", "register", "bench", "--path", str(home / "artifact")], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run([*cli, "deploy", "bench@1", "--replicas", "1", "--cpus-per-replica",
                        f"{args.cpus_per_replica:g}", "--max-batch", str(args.max_batch), "--max-wait-ms",
                        f"{args.max_wait_ms:g}"], env=env, check=True, stdout=subprocess.DEVNULL)
        auth = {"Authorization": f"Bearer {server.admin_token}"}
        deadline = time.monotonic() + 300
        while True:
            dep = httpx.get(f"{server.url}/v1/deployments/bench", headers=auth, timeout=5).json()
            routed = [r for r in dep.get("replica_jobs", []) if r["routed"]]
            if routed:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"the deployment never became ready: {dep}")
            time.sleep(1)
        replica_url = routed[0]["endpoint"] + "/predict"
        # a replica answers only callers with the secret the platform gave it (the balancer sends it):
        # the direct baseline reads it where the platform keeps it, the job's environment
        with sqlite3.connect(server.home / "deeppod.db") as db:
            env = json.loads(db.execute("SELECT env FROM jobs WHERE id = ?", (routed[0]["job_id"],)).fetchone()[0])
        if set(env) == {"sealed"}:  # sealed at rest with the server's key (store/sealed.py)
            from cryptography.fernet import Fernet

            env = json.loads(Fernet((server.home / "secret.key").read_bytes().strip()).decrypt(env["sealed"].encode()))
        grant = httpx.post(f"{server.url}/v1/deployments/bench/direct", json={"ttl_seconds": 86400}, headers=auth,
                           timeout=30).json()
        systems = {"platform": (dep["predict_url"], auth),
                   "direct": (grant["replicas"][0]["url"] + "/predict", {"Authorization": f"Bearer {grant['token']}"}),
                   "replica": (replica_url, {REPLICA_SECRET_HEADER: env.get(ENV_REPLICA_SECRET, "")})}
        plain = PlainServer(home / "artifact")
        systems["fastapi"] = (plain.url, {})
        if args.ray_python:
            systems["ray_serve"] = (None, {})  # started for its turn only: an idle Ray cluster is not idle

        def check(name: str, url: str, headers: dict) -> None:  # it answers before the clock starts
            r = httpx.post(url, content=body, headers={**headers, "content-type": "image/jpeg"}, timeout=60)
            if r.status_code != 200:
                raise SystemExit(f"{name} answered {r.status_code}: {r.text[:300]}")

        revocation_ms = time_revocation(server.url, auth, body)
        print(f"a deployment key's direct token refused {revocation_ms:.0f} ms after the key was revoked")
        runs: dict[str, dict[int, list[dict]]] = {s: {c: [] for c in levels} for s in systems}

        def measure(rnd: int, name: str, url: str, headers: dict, c: int, slices: int) -> None:
            """``slices`` runs of duration/slices seconds each, as one; between two slices of one
            system the others take theirs (see the loop below)."""
            took: list[dict] = []
            cpu = {}
            for _ in range(slices):
                yield  # the others' turn
                procs = serving_processes(name, server, plain)
                before = cpu_seconds(procs)
                took.append(closed_loop(url, body, "image/jpeg", concurrency=c, duration=args.duration / slices,
                                        headers=headers, warmup=0.5, keep_latencies=True))
                after = cpu_seconds(procs)
                cpu = {k: cpu.get(k, 0.0) + after[k] - before[k] for k in procs}
            r = merged(took, args.duration)
            if cpu and r["requests"]:  # CPU per answered request, warm-ups included
                r["cpu_ms_per_request"] = {k: round(1000 * v / (r["requests"] * (args.duration + 0.5 * slices) /
                                                                args.duration), 2) for k, v in cpu.items()}
            runs[name][c].append(r)
            print(f"round {rnd + 1} {name:9s} c={c:<3} {r['throughput_rps']:7.1f} req/s  "
                  f"p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms  errors {r['errors']}", flush=True)

        def run_all(rnd: int, names: list[str], c: int, slices: int) -> None:
            turns = [measure(rnd, n, *systems[n], c, slices) for n in names]
            for _ in range(slices + 1):  # slice by slice, every system in turn
                for t in turns:
                    next(t, None)

        always_up = [n for n in systems if n != "ray_serve"]
        for name in always_up:
            check(name, *systems[name])
        for rnd in range(args.rounds):
            # at each concurrency the systems take turns in short slices, in turned order every
            # other round: what the machine drifts by in a few seconds falls on all of them alike
            for c in levels:
                run_all(rnd, always_up if rnd % 2 == 0 else always_up[::-1], c, args.slices)
            if "ray_serve" in systems:
                ray, url = start_ray(args.ray_python, home / "artifact", args.cpus_per_replica, args.max_batch,
                                     args.max_wait_ms, home / f"ray-{rnd}.log")
                check("ray_serve", url, {})
                systems["ray_serve"] = (url, {})  # this round's Ray Serve: its turns measure it
                for c in levels:
                    run_all(rnd, ["ray_serve"], c, 1)
                stop_ray(ray)
                ray = None
    finally:
        if ray is not None:
            stop_ray(ray)
        if plain is not None:
            plain.close()
        server.stop()
        server.end_jobs()  # the deployment's replica outlives the server otherwise

    for s_, per in runs.items():  # CPU per request, median over rounds
        for c, rows in per.items():
            cpu = [r["cpu_ms_per_request"] for r in rows if "cpu_ms_per_request" in r]
            if cpu:
                print(f"{s_:9s} c={c:<3} CPU per request: " + ", ".join(
                    f"{role} {statistics.median(x[role] for x in cpu):.1f} ms" for role in cpu[0]))
    table = {s: {c: {"throughput_rps": statistics.median(r["throughput_rps"] for r in rows),
                     "p50_ms": statistics.median(r["p50_ms"] for r in rows),
                     "p99_ms": statistics.median(r["p99_ms"] for r in rows),
                     "errors": sum(r["errors"] for r in rows)} for c, rows in per.items()} for s, per in runs.items()}
    print(f"\nmedian of {args.rounds} rounds, {args.duration:g} s each; req/s (p99 ms)")
    print("system      " + "".join(f"{'c=' + str(c):>20}" for c in levels))
    for s, per in table.items():
        print(f"{s:11s} " + "".join(f"{per[c]['throughput_rps']:>11.1f} ({per[c]['p99_ms']:5.1f})" for c in levels))
    ratios = {}
    for other in [s for s in table if s != "platform"]:
        ratios[other] = {c: round(table["platform"][c]["throughput_rps"] / table[other][c]["throughput_rps"], 3)
                         for c in levels}
        print(f"platform / {other:9s} " + "  ".join(f"c={c}: {v:.2f}x" for c, v in ratios[other].items()))
    print("\nper round (every system once a round), the platform's req/s over each other's: median (worst-best)")
    spreads: dict = {}
    pairs = [("platform", o) for o in table if o != "platform"] + [("direct", o) for o in table
                                                                    if o not in ("platform", "direct")]
    for mine, other in pairs:
        for c in levels:
            sp = Spread.of([p["throughput_rps"] / o["throughput_rps"]
                            for p, o in zip(runs[mine][c], runs[other][c])])
            spreads.setdefault(other if mine == "platform" else f"{mine}/{other}", {})[c] = sp.as_dict()
            print(f"  c={c:<3} " + sp.line(f"{mine} / {other}", aim=0.95 if other == "replica" else None))
    print(meter.line())
    if 1 in levels:
        gap = table["platform"][1]["p99_ms"] - table["fastapi"][1]["p99_ms"]
        print(f"p99 at c=1: platform {table['platform'][1]['p99_ms']:.1f} ms, plain FastAPI "
              f"{table['fastapi'][1]['p99_ms']:.1f} ms ({gap:+.1f} ms; aim within 5 ms)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": args.model, "image_bytes": len(body), "cpus_per_replica":
                                    args.cpus_per_replica, "rounds": args.rounds, "duration_s": args.duration,
                                    "machine": machine(), "other_cores": round(meter.cores(), 2),
                                    "revocation_ms": round(revocation_ms, 1),
                                    "median": table, "ratios": ratios, "spread": spreads,
                                    "runs": runs}, indent=1))
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
