from __future__ import annotations

from datetime import datetime

from pydantic import Field

from deeppod.api.schemas.base import Out, Strict


class DeploymentIn(Strict):
    name: str | None = Field(default=None, description="the deployment's name (default: the model's)")
    model: str = Field(description="NAME, NAME@VERSION or NAME@ALIAS")
    replicas: int = 1
    gpus_per_replica: int = 0
    cpus_per_replica: float = 1.0
    max_batch: int = 32
    max_wait_ms: float = 5.0


class DeploymentPatch(Strict):
    version: str | None = Field(default=None, description="a version number or alias to roll out")
    replicas: int | None = None
    max_batch: int | None = None
    max_wait_ms: float | None = None


class AnnounceIn(Strict):
    url: str = Field(max_length=256)
    version: int | None = None


class KeyIn(Strict):
    name: str = Field(default="", max_length=128)


class KeyOut(Out):
    id: int
    name: str
    created_at: datetime
    revoked_at: datetime | None = None
    key: str | None = Field(default=None, description="shown once, at creation")


class ReplicaOut(Out):
    job_id: int
    version: int
    state: str
    endpoint: str | None
    routed: bool
    inflight: int
    restarts: int


class DeploymentOut(Out):
    name: str
    model: str
    version: int
    previous_version: int | None
    replicas: int
    gpus_per_replica: int
    cpus_per_replica: float
    max_batch: int
    max_wait_ms: float
    state: str
    reason: str
    predict_url: str
    page_url: str
    signature: dict
    replica_jobs: list[ReplicaOut]
    created_at: datetime
    updated_at: datetime
