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


class DirectIn(Strict):
    ttl_seconds: float = Field(default=600, description="how long the token lasts (at most a day); ask again "
                                                         "before it ends")


class DirectReplicaOut(Out):
    job_id: int
    url: str
    version: int


class DirectOut(Out):
    token: str = Field(description="send as 'Authorization: Bearer TOKEN' to a replica's /predict")
    token_id: str
    expires_at: float = Field(description="Unix seconds")
    replicas: list[DirectReplicaOut] = Field(description="where to send predictions now (POST URL/predict, the same "
                                                         "body as the platform's predict); ask again when one stops "
                                                         "answering or answers 503")


class DirectUse(Strict):
    jti: str = Field(max_length=32)
    codes: dict[str, int]
    seconds: float = Field(ge=0)


class DirectRefusal(Strict):
    jti: str | None = Field(default=None, max_length=32)
    user: str | None = Field(default=None, max_length=64)
    status: int
    code: str = Field(max_length=32)
    client: str = Field(default="", max_length=64)


class DirectSyncIn(Strict):
    usage: list[DirectUse] = Field(default_factory=list, max_length=10_000)
    refused: list[DirectRefusal] = Field(default_factory=list, max_length=100)
    refused_count: int = Field(default=0, ge=0)


class DirectSyncOut(Out):
    revoked: list[str]
