"""The web console with 10,000 jobs and a job of 100,000 metric points: what a page costs the
server and the browser, against the naive pages a console without paging or downsampling
would serve (every job in one table; every point to the chart).

A real `deeppod server` process (SQLite, the default) on loopback, its database filled
directly; requests with a signed-in console session, median of N, interleaved:

- jobs list: the console's /jobs (50 rows a page, sorted and filtered by the database)
  vs the same rows unpaged (the API's /v1/jobs?limit=10000, JSON: the least a client-side
  table would need);
- a job's charts: the console's /jobs/ID/metrics.json (at most 1,000 points a metric)
  vs every point (/v1/jobs/ID/metrics?max_points=100000).

    python benchmarks/console_pages.py [--jobs 10000] [--points 100000] [--rounds 15]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def fill(home: Path, jobs: int, points: int) -> int:
    """``jobs`` finished jobs and one with ``points`` steps of loss and accuracy; its id."""
    from sqlalchemy import insert

    from deeppod.contract import JobState
    from deeppod.store import sealed
    from deeppod.store.db import make_engine
    from deeppod.store.models import Job, JobMetric

    sealed.configure((home / "secret.key").read_bytes().strip())  # jobs' env is sealed with the server's key
    engine = make_engine(f"sqlite:///{home / 'deeppod.db'}")
    with engine.begin() as c:
        c.execute(insert(Job), [{"name": f"resnet-{i % 97}", "tenant_id": 1, "user_id": 1, "command": ["python",
                                                                                                       "t.py"],
                                 "workdir": "/tmp", "state": JobState.SUCCEEDED if i % 3 else JobState.FAILED,
                                 "gpus_per_worker": 1, "workers": 1 + i % 4} for i in range(jobs)])
        c.execute(insert(Job), [{"name": "long-run", "tenant_id": 1, "user_id": 1, "command": ["python", "t.py"],
                                 "workdir": "/tmp", "state": JobState.SUCCEEDED}])
        job_id = jobs + 1
        for name in ("loss", "accuracy"):
            c.execute(insert(JobMetric), [{"job_id": job_id, "name": name, "step": s, "value": 1.0 / (s + 1)}
                                          for s in range(points // 2)])
    engine.dispose()
    return job_id


def timed(client: httpx.Client, url: str, **kw) -> tuple[float, int]:
    began = time.perf_counter()
    r = client.get(url, **kw)
    r.raise_for_status()
    return time.perf_counter() - began, len(r.content)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--points", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    from tests.helpers import LiveServer

    with tempfile.TemporaryDirectory() as tmp:
        server = LiveServer(Path(tmp) / "home", gpus=4).start()
        try:
            server.stop()  # fill the database while nothing else writes to it
            job_id = fill(server.home, a.jobs, a.points)
            server.start()
            token = server.admin_token
            console = httpx.Client(base_url=server.url, timeout=120)
            r = console.post("/login", data={"token": token, "next": "/jobs"})
            assert r.status_code == 303, r.text
            api = httpx.Client(base_url=server.url, timeout=120, headers={"Authorization": f"Bearer {token}"})
            cases = {
                "jobs list": ((console, "/jobs", {}), (api, "/v1/jobs?limit=10000", {})),
                "jobs list, filtered and sorted": ((console, "/jobs?name=resnet-1&state=failed&sort=name", {}),
                                                   (api, "/v1/jobs?limit=10000&name=resnet-1&state=failed", {})),
                "a job's charts": ((console, f"/jobs/{job_id}/metrics.json", {}),
                                   (api, f"/v1/jobs/{job_id}/metrics?max_points=100000", {})),
            }
            r = console.get("/jobs")
            assert r.status_code == 200, (r.status_code, r.text[-900:])
            page = r.text
            assert re.search(r"(\d+) jobs", page).group(1) == str(a.jobs + 1)
            print(f"{a.jobs + 1} jobs, a job of {a.points} metric points; median of {a.rounds} requests each; "
                  f"server {server.url}")
            print(f"{'page':34} {'console ms':>11} {'KB':>8} {'naive ms':>10} {'KB':>8} {'ratio':>7}")
            for what, (ours, naive) in cases.items():
                t_ours, t_naive = [], []
                for _ in range(a.rounds):  # interleaved
                    t, size_ours = timed(ours[0], ours[1])
                    t_ours.append(t)
                    t, size_naive = timed(naive[0], naive[1])
                    t_naive.append(t)
                mo, mn = statistics.median(t_ours), statistics.median(t_naive)
                print(f"{what:34} {1000 * mo:11.1f} {size_ours / 1024:8.1f} {1000 * mn:10.1f} "
                      f"{size_naive / 1024:8.1f} {mn / mo:6.1f}x")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
