"""The floor benchmarks/api_load.py compares DeepPod's API with: a bare FastAPI + SQLAlchemy
app (sync handlers, as DeepPod's) doing the same queries on the same database, with no
authentication, audit or paging logic: GET /v1/jobs/{id} and GET /v1/jobs?limit=50.

    python benchmarks/api_floor.py DATABASE_URL PORT SECRET_KEY_FILE

(The key opens the jobs' sealed --env column, which the row holds.)
"""

from __future__ import annotations

import sys

import uvicorn
from fastapi import FastAPI, HTTPException
from sqlalchemy import create_engine, select
from sqlalchemy.orm import sessionmaker

sys.path.insert(0, __file__.rsplit("/benchmarks/", 1)[0] + "/src")
from deeppod.store import sealed  # noqa: E402
from deeppod.store.models import Job  # noqa: E402  (the same table)

COLUMNS = ("id", "name", "state", "workers", "gpus_per_worker", "priority", "submitted_at", "started_at", "ended_at")


def app_for(url: str) -> FastAPI:
    engine = create_engine(url, **({"connect_args": {"check_same_thread": False}} if url.startswith("sqlite") else
                                   {"pool_size": 10, "max_overflow": 20}))
    sessions = sessionmaker(engine)
    app = FastAPI()

    def row(job: Job) -> dict:
        return {c: getattr(job, c) for c in COLUMNS}

    @app.get("/v1/jobs/{job_id}")
    def one(job_id: int) -> dict:
        with sessions() as s:
            job = s.get(Job, job_id)
            if job is None:
                raise HTTPException(404)
            return row(job)

    @app.get("/v1/jobs")
    def page(limit: int = 50) -> list[dict]:
        with sessions() as s:
            return [row(j) for j in s.scalars(select(Job).order_by(Job.id.desc()).limit(limit))]

    @app.get("/healthz")
    def healthz() -> dict:
        return {"ok": True}

    return app


if __name__ == "__main__":
    with open(sys.argv[3], "rb") as key:
        sealed.configure(key.read().strip())
    uvicorn.run(app_for(sys.argv[1]), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning", access_log=False)
