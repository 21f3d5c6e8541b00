"""A job's start with its own Python environment: DeepPod (`--requirements`, built with uv on
the node, cached per tenant) side by side with Ray's `runtime_env` (its `uv` and `pip`
plugins) on the same requirements, each from an empty download cache. For each system and
round: the cold start (the environment is built: downloads, install) and the cached start
(a second job with the same requirements), each measured from submit to the first line of
the job's code, and the same start with no environment of its own as the baseline; what the
environment adds is the difference.

    sudo .venv/bin/python benchmarks/env_start.py [--requirements rich==13.9.4,pyyaml==6.0.2] [--rounds 3]

DeepPod runs as a user gets it as root: sandboxed, the build as the tenant in a sandbox. Each
round is a new tenant (its own empty cache) for DeepPod and a new Ray session with the
installers' caches off (`--no-cache`) for Ray, so every cold start downloads. Needs the
package index (PyPI) reachable, and `virtualenv` for Ray's plugins (`pip install virtualenv`). Prints the medians and
the ratios (Ray / DeepPod: above 1,
DeepPod starts sooner).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from deeppod import Client
from deeppod.bench.server import Server

PROBE = "import sys, time\nprint('started', repr(time.time()), flush=True)\n"


def _started_at(server: Server, job_id: int) -> float:
    out = (server.home / "jobs" / str(job_id) / "logs" / "rank-0.log").read_text()
    return float(next(line.split()[1] for line in out.splitlines() if line.startswith("started ")))


def deeppod_round(server: Server, admin: Client, code: Path, requirements: list[str], n: int) -> dict:
    admin.create_tenant(f"bench{n}")
    c = Client(server.url, admin.create_user(f"bench{n}", f"bench{n}")["token"])

    def start(reqs) -> float:
        began = time.time()
        job = c.submit(["python", "probe.py"], code=str(code), gpus_per_worker=0, requirements=reqs)
        done = c.wait(job["id"], timeout=900)
        if done["state"] != "succeeded":
            raise SystemExit(f"DeepPod job failed: {done['reason']}")
        return _started_at(server, job["id"]) - began

    plain = start(None)
    cold = start(requirements)
    cached = start(requirements)
    return {"plain": plain, "cold": cold, "cached": cached}


def ray_round(requirements: list[str], plugin: str, find_links: str | None = None) -> dict:
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # else Ray writes ~/.ray/auth_token, which later clusters expect
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="dprayenv", dir="/tmp"))
    try:
        @ray.remote
        def probe() -> float:
            return time.time()

        def start(env) -> float:
            began = time.time()
            return ray.get(probe.options(runtime_env=env).remote()) - began

        local = ["--find-links", find_links, "--no-index"] if find_links else []
        if plugin == "uv":
            env = {"uv": {"packages": requirements, "uv_pip_install_options": ["--no-cache", *local]}}
        else:
            env = {"pip": {"packages": requirements, "pip_install_options": ["--no-cache-dir", *local]}}
        plain = start(None)
        cold = start(env)
        cached = start(env)
        return {"plain": plain, "cold": cold, "cached": cached}
    finally:
        ray.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requirements", default="rich==13.9.4,pyyaml==6.0.2")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--find-links", help="a folder of wheels to install from, instead of the package index "
                                        "(for every system)")
    p.add_argument("--systems", default="deeppod,ray-uv,ray-pip", help="ray-pip needs virtualenv")
    args = p.parse_args()
    requirements = [r for r in args.requirements.split(",") if r]
    results: dict[str, list[dict]] = {s: [] for s in args.systems.split(",")}
    if any(s.startswith("ray-") for s in results):
        import importlib.util

        if importlib.util.find_spec("virtualenv") is None:
            raise SystemExit("Ray's runtime_env plugins need virtualenv: pip install virtualenv (or --systems deeppod)")
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        code = root / "code"
        code.mkdir()
        (code / "probe.py").write_text(PROBE)
        local = {"DEEPPOD_ENV_FIND_LINKS": args.find_links, "DEEPPOD_ENV_NO_INDEX": "1"} if args.find_links else {}
        server = Server(root / "home", {"DEEPPOD_ISOLATION": "sandbox", **local}).start()
        try:
            admin = Client(server.url, (server.home / "admin.token").read_text().strip())
            for n in range(args.rounds):  # interleaved: a busy moment costs every system alike
                for system in results:
                    results[system].append(deeppod_round(server, admin, code, requirements, n) if system == "deeppod"
                                           else ray_round(requirements, system.removeprefix("ray-"), args.find_links))
        finally:
            server.end_jobs()
            server.stop()
    print(json.dumps(results))
    med = {k: {m: statistics.median(r[m] for r in rows) for m in ("plain", "cold", "cached")}
           for k, rows in results.items()}
    for k, m in med.items():
        print(f"{k:8} plain {m['plain']:.2f} s  cold {m['cold']:.2f} s (adds {m['cold'] - m['plain']:.2f} s)  "
              f"cached {m['cached']:.2f} s (adds {m['cached'] - m['plain']:.2f} s)")
    for k in [s for s in results if s != "deeppod"]:
        print(f"cold start, {k} / deeppod: {med[k]['cold'] / med['deeppod']['cold']:.2f}x; worst round "
              f"{min(r['cold'] / d['cold'] for r, d in zip(results[k], results['deeppod'])):.2f}x")
    print(f"deeppod: a cached environment adds {med['deeppod']['cached'] - med['deeppod']['plain']:.2f} s to a "
          f"job's start (aim < 0.5 s); python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
