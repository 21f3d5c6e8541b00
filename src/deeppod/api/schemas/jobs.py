from __future__ import annotations

from datetime import datetime

from pydantic import Field

from deeppod.api.schemas.base import Out, Strict, from_dataclass
from deeppod.contract import JobState
from deeppod.job_spec import JobSpec
from deeppod.jobs import service

JobCreate = from_dataclass(JobSpec, "JobCreate")  # the fields, defaults and bounds: deeppod/job_spec.py


class JobOut(Out):
    id: int
    name: str
    # batch (submitted work), serve (a deployment's replica), evaluate (a model comparison), trial (a search trial)
    kind: str = "batch"
    tenant: str
    user: str
    state: JobState
    command: list[str]
    workdir: str
    env: dict[str, str] = Field(description="the names the job set; values are write-only (shown as '***')")
    workers: int
    max_workers: int | None
    gpus_per_worker: int
    cpus_per_worker: float
    memory_mb_per_worker: int | None
    gpu_memory_mb: int | None = None
    pids_per_worker: int | None = None
    network: str = "host"
    requirements: str | None = None
    python: str | None = None
    image: str | None = None
    env_key: str | None = None
    phase: str | None = None
    priority: int
    grace_seconds: float
    time_limit_seconds: float | None = Field(default=None, description="the longest one run may last (seconds)")
    restart_count: int
    max_restarts: int
    preemptible: bool
    stop_rules: list[dict]
    datasets: list[dict] = []
    models: list[dict] = Field(default=[], description="the model versions it reads: ref, version_id, env")
    stop_reason: str | None
    cancel_requested: bool
    allocation: dict | None
    exit_codes: dict[str, int] | None
    reason: str
    submitted_at: datetime
    started_at: datetime | None = Field(description="when the current run (or its current size) started")
    ended_at: datetime | None
    purged_at: datetime | None = None
    run_seconds: float = Field(default=0.0, description="wall seconds it has run, every run added up (a resumed or "
                                                        "requeued job's earlier runs too)")
    warning: str | None = Field(default=None, description="in the answer to a submit only: why the job, as asked, "
                                "can never start here (it waits until it is cancelled)")


class JobSpecOut(Out):
    fields: dict = Field(description="the submit options that made the job, as spec fields (--env values left out)")
    yaml: str = Field(description="the same as a file: deeppod submit --spec FILE submits it again")


class JobEventOut(Out):
    id: int
    at: datetime
    kind: str
    message: str


def job_out(job, tenant: str, user: str) -> JobOut:
    return JobOut.model_validate({**{c: getattr(job, c) for c in JobOut.model_fields if hasattr(job, c)},
                                  "env": {k: HIDDEN for k in job.env}, "tenant": tenant, "user": user,
                                  "models": [{k: v for k, v in m.items() if k != "path"} for m in job.models or []],
                                  "run_seconds": service.run_seconds(job)})


HIDDEN = "***"  # --env values may be secrets: the API never shows them back


class PurgeIn(Strict):
    older_than_seconds: float = Field(ge=0, le=100 * 366 * 86400,
                                      description="remove the folders of jobs that ended longer ago than this")


class PurgeOut(Out):
    jobs: list[int]
    bytes_freed: int
