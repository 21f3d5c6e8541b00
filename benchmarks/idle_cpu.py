"""What an idle platform costs: CPU of the control plane with no jobs and no requests, and with
a deployment running but no traffic (the control plane and the replica apart), against a plain
uvicorn + FastAPI server that does nothing (the floor any Python web server pays).
Aims: control plane < 1% of a core idle, < 2% with deployments and no traffic.

    python benchmarks/idle_cpu.py [--seconds 60] [--settle 10] [--replicas 1] [--out FILE]

CPU is read from /proc (user + system seconds of each process over the same wall time).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from deeppod.bench.infer import export_model
from deeppod.bench.server import Server
from deeppod.contract import free_port

ROOT = Path(__file__).resolve().parents[1]
PLAIN = """
import sys, uvicorn
from fastapi import FastAPI
app = FastAPI()
@app.get("/healthz")
def healthz():
    return {"ok": True}
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def cpu_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def percent_of_core(procs: list[psutil.Process], seconds: float) -> float:
    before, t0 = cpu_seconds(procs), time.monotonic()
    time.sleep(seconds)
    return round(100.0 * (cpu_seconds(procs) - before) / (time.monotonic() - t0), 3)


def replica_processes() -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "deeppod.serve.replica" in cmd:
            out.append(p)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="measured wall time per figure")
    ap.add_argument("--settle", type=float, default=10.0, help="wait this long before measuring")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--model", default="mobilenet_v3_small", help="what the deployment serves (its idle replica)")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "idle_cpu.json")
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="deeppod-bench-idle-"))
    rows = {}

    port = free_port()
    plain = subprocess.Popen([sys.executable, "-c", PLAIN, str(port)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        time.sleep(args.settle)
        rows["plain_fastapi_idle"] = percent_of_core([psutil.Process(plain.pid)], args.seconds)
    finally:
        plain.terminate()
        plain.wait(10)
    print(f"plain uvicorn + FastAPI, idle:            {rows['plain_fastapi_idle']:6.2f}% of a core")

    server = Server(home / "server").start()
    try:
        control = psutil.Process(server.proc.pid)
        time.sleep(args.settle)
        rows["control_plane_idle"] = percent_of_core([control], args.seconds)
        print(f"DeepPod control plane, no jobs:           {rows['control_plane_idle']:6.2f}% of a core")

        env = {**server.env, "DEEPPOD_API_URL": server.url, "DEEPPOD_TOKEN": server.admin_token}
        export_model(home / "artifact", args.model, args.image_size)
        cli = [sys.executable, "-m", "deeppod.cli"]
        subprocess.run([*cli, "models", "register", "idle", "--path", str(home / "artifact")], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run([*cli, "deploy", "idle@1", "--replicas", str(args.replicas)], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        headers = {"authorization": f"Bearer {server.admin_token}"}
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            dep = httpx.get(f"{server.url}/v1/deployments/idle", headers=headers, timeout=5).json()
            if sum(r["routed"] for r in dep.get("replica_jobs", [])) >= args.replicas:
                break
            time.sleep(1)
        else:
            raise SystemExit(f"the deployment never became ready: {dep}")
        time.sleep(args.settle)
        replicas = replica_processes()
        before = cpu_seconds([control]), cpu_seconds(replicas)
        t0 = time.monotonic()
        time.sleep(args.seconds)
        wall = time.monotonic() - t0
        rows["control_plane_deployed"] = round(100 * (cpu_seconds([control]) - before[0]) / wall, 3)
        rows["replica_idle"] = round(100 * (cpu_seconds(replicas) - before[1]) / wall / max(1, len(replicas)), 3)
        print(f"DeepPod control plane, {args.replicas} replica(s), no traffic: "
              f"{rows['control_plane_deployed']:6.2f}% of a core")
        print(f"one replica, no traffic:                  {rows['replica_idle']:6.2f}% of a core")
    finally:
        server.stop()
        server.end_jobs()  # the deployment's replica outlives the server otherwise
    for k in ("control_plane_idle", "control_plane_deployed"):
        aim = 1.0 if k == "control_plane_idle" else 2.0
        print(f"{k}: {rows[k]:.2f}% (aim < {aim}%), {rows[k] / max(rows['plain_fastapi_idle'], 0.01):.1f}x "
              f"the plain server's idle")
    doc = {"seconds": args.seconds, "machine": f"{os.cpu_count()} CPUs", "percent_of_core": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
