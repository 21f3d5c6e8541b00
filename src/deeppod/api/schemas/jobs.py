from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from deeppod.api.schemas.base import Out, Strict
from deeppod.contract import JobState
from deeppod.jobs import service


class JobCreate(Strict):
    command: list[str] = Field(min_length=1, description="argv of every worker, e.g. ['python', 'train.py']")
    workdir: str | None = Field(default=None, max_length=4096,
                                description="absolute working directory on the server host; left out, the job "
                                            "works in a folder of its own holding its 'code' (or nothing)")
    code: str | None = Field(default=None, pattern="^[0-9a-f]{64}$",
                             description="digest of the job's code sent with PUT /v1/code/DIGEST")
    name: str | None = Field(default=None, max_length=128)
    workers: int = Field(default=1, ge=1, le=4096, description="workers that start together (the minimum)")
    max_workers: int | None = Field(default=None, ge=1, le=4096, description="elastic: grow up to this many")
    gpus_per_worker: int | None = Field(default=None, ge=0, le=64,
                                        description="default: 1 when the cluster has GPUs, else 0")
    cpus_per_worker: float | None = Field(default=None, gt=0, le=1024,
                                          description="default: a GPU worker gets its node's CPUs per GPU for each "
                                                      "GPU (so every GPU can be used); a CPU worker 1")
    memory_mb_per_worker: int | None = Field(default=None, ge=1)
    gpu_memory_mb: int | None = Field(default=None, ge=1, le=1 << 24,
                                      description="the memory each of a worker's GPUs must have (MiB): it is placed "
                                                  "only on such GPUs, and refused at submit where the cluster has "
                                                  "none")
    pids_per_worker: int | None = Field(default=None, ge=16, le=1 << 22,
                                        description="processes and threads each worker may have (sandbox isolation); "
                                                    "default: the plan's pids_per_worker for the tenant, else the "
                                                    "server's DEEPPOD_PIDS_PER_WORKER")
    network: Literal["host", "isolated", "none"] | None = Field(
        default=None, description="host: the host's network; isolated: its own (a network namespace) where only the "
                                  "API is reachable; none: its own, nothing reachable (sandbox isolation; one node). "
                                  "Default: the server's DEEPPOD_JOB_NETWORK (host)")
    requirements: str | None = Field(default=None, max_length=65536,
                                     description="a requirements.txt's text: the job runs in a Python environment "
                                                 "built from it (once per tenant and node, then cached)")
    python: str | None = Field(default=None, max_length=16, description="its environment's Python, e.g. 3.12 (one "
                                                                        "the nodes have)")
    image: str | None = Field(default=None, max_length=128,
                              description="a container image this server offers, by name (GET /v1/images): the job "
                                          "runs in it, sandboxed as any job")
    env: dict[str, str] = Field(default_factory=dict)
    priority: int = Field(default=0, ge=-1000, le=1000)
    grace_seconds: float | None = Field(default=None, ge=0, le=3600)
    preemptible: bool = True
    max_restarts: int = Field(default=0, ge=0, le=100)
    stop_rules: list[dict] = Field(default_factory=list, max_length=20,
                                   description="[{'kind': 'nan', 'metric': 'loss'}, {'kind': 'plateau', "
                                               "'metric': 'val_loss', 'patience': 5, 'mode': 'min'}]")
    datasets: list[str] = Field(default_factory=list, max_length=16,
                                description="datasets to stage before start, NAME[@VERSION]; each job worker "
                                            "finds its folder in DEEPPOD_DATA_<NAME>")


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
    restart_count: int
    max_restarts: int
    preemptible: bool
    stop_rules: list[dict]
    datasets: list[dict] = []
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
                                  "run_seconds": service.run_seconds(job)})


HIDDEN = "***"  # --env values may be secrets: the API never shows them back


class PurgeIn(Strict):
    older_than_seconds: float = Field(ge=0, le=100 * 366 * 86400,
                                      description="remove the folders of jobs that ended longer ago than this")


class PurgeOut(Out):
    jobs: list[int]
    bytes_freed: int
