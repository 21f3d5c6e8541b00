"""SQLAlchemy models: tenants, users, tokens, nodes, jobs, datasets, models, deployments."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from deeppod.contract import JobState
from deeppod.store.sealed import SealedJSON


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC on every backend (SQLite drops the zone on the way back)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):  # noqa: ANN001
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value

    def process_result_value(self, value, dialect):  # noqa: ANN001
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value


class JobStateType(TypeDecorator):
    """A job's state is a :class:`JobState` in Python and its plain value in the table."""

    impl = String(16)
    cache_ok = True

    def process_bind_param(self, value, dialect):  # noqa: ANN001
        return None if value is None else JobState(value).value

    def process_result_value(self, value, dialect):  # noqa: ANN001
        return None if value is None else JobState(value)


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime(), dict: JSON, list: JSON}


class Tenant(Base):
    __tablename__ = "tenants"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # the unprivileged OS identity its jobs run as (sandbox isolation), made on first use
    os_user: Mapped[str | None] = mapped_column(String(32), nullable=True)
    os_uid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    os_gid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # the disk its jobs' folders take, as last measured (jobs/quotas.py); None: not yet
    storage_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    role: Mapped[str] = mapped_column(String(16), default="member")  # deeppod.auth.roles.ROLES
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


class Token(Base):
    __tablename__ = "tokens"
    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    # sha256 of the secret; the secret itself is shown once and never stored.
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(128), default="")
    job_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    scope: Mapped[str] = mapped_column(String(16), default="all")  # deeppod.auth.roles.SCOPES
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(nullable=True)


class Node(Base):
    __tablename__ = "nodes"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    address: Mapped[str] = mapped_column(String(128), default="127.0.0.1")
    # [{"index": 0, "uuid": "...", "name": "...", "memory_mb": 0, "logical": true}]
    gpus: Mapped[list] = mapped_column(default=list)
    cpus: Mapped[int] = mapped_column(Integer, default=1)
    memory_mb: Mapped[int] = mapped_column(Integer, default=0)
    healthy: Mapped[bool] = mapped_column(Boolean, default=True)  # False: cordoned by an administrator
    up: Mapped[bool] = mapped_column(Boolean, default=True)  # False: the executor lost it (a Ray node that left)
    down_reason: Mapped[str | None] = mapped_column(Text, nullable=True)  # why, in its cluster's words (Slurm's)
    last_seen: Mapped[datetime] = mapped_column(default=utcnow)
    burst: Mapped[str | None] = mapped_column(String(64), nullable=True)  # a burst node's type (scheduler/burst.py)
    joined_at: Mapped[datetime | None] = mapped_column(nullable=True)  # when it was first seen


class BurstCharge(Base):
    """What a tenant was charged for one burst node: its time there, at its type's cost per
    hour (scheduler/burst.py; accrued by cluster/burst.py while the node is up)."""

    __tablename__ = "burst_charges"
    __table_args__ = (UniqueConstraint("node", "tenant"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    node: Mapped[str] = mapped_column(String(128))
    node_type: Mapped[str] = mapped_column(String(64))
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    seconds: Mapped[float] = mapped_column(Float, default=0.0)
    cost: Mapped[float] = mapped_column(Float, default=0.0)
    first_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_at: Mapped[datetime] = mapped_column(default=utcnow)


class Server(Base):
    """A running ``deeppod server`` (several share one PostgreSQL database: a failover control
    plane). Times are the database's clock in seconds, so servers' clocks never disagree."""

    __tablename__ = "servers"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    url: Mapped[str] = mapped_column(String(512))  # where jobs, clients and the other servers reach it
    host: Mapped[str] = mapped_column(String(255), default="")
    pid: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[float] = mapped_column(Float)
    seen_at: Mapped[float] = mapped_column(Float, index=True)  # its last heartbeat


class LeaderLease(Base):
    """One row: which server leads (runs the reconcile loop and the executor) until when.
    ``epoch`` grows at every change of leader: the fencing token every executor action checks."""

    __tablename__ = "leadership"
    id: Mapped[int] = mapped_column(primary_key=True)  # always 1
    server_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    url: Mapped[str] = mapped_column(String(512), default="")
    epoch: Mapped[int] = mapped_column(BigInteger, default=0)
    expires_at: Mapped[float] = mapped_column(Float, default=0.0)


class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    state: Mapped[JobState] = mapped_column(JobStateType(), index=True, default=JobState.QUEUED)
    command: Mapped[list] = mapped_column(default=list)
    workdir: Mapped[str] = mapped_column(Text)
    env: Mapped[dict] = mapped_column(SealedJSON(), default=dict)  # the user's --env: sealed at rest
    workers: Mapped[int] = mapped_column(Integer, default=1)  # minimum: the gang that starts together
    max_workers: Mapped[int | None] = mapped_column(Integer, nullable=True)  # elastic when above workers
    gpus_per_worker: Mapped[int] = mapped_column(Integer, default=0)
    cpus_per_worker: Mapped[float] = mapped_column(Float, default=1.0)
    memory_mb_per_worker: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gpu_memory_mb: Mapped[int | None] = mapped_column(Integer, nullable=True)  # what each of its GPUs must have
    pids_per_worker: Mapped[int | None] = mapped_column(Integer, nullable=True)  # None: its plan's, or the server's
    # its own Python environment (envs/): requirements (one per line) and interpreter; the key
    # of the environment its last start used; what its supervisor does before the workers start
    requirements: Mapped[str | None] = mapped_column(Text, nullable=True)
    python: Mapped[str | None] = mapped_column(String(16), nullable=True)
    image: Mapped[str | None] = mapped_column(String(128), nullable=True)  # a container image's name (envs/images.py)
    env_key: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)
    # Slurm's reasons in DeepPod's words run past 64 characters (its column was String(64) until 0029)
    phase: Mapped[str | None] = mapped_column(Text, nullable=True)
    # "host" (the host's network), "isolated" (its own, with only the API: executor/netns.py) or "none"
    network: Mapped[str] = mapped_column(String(16), default="host", server_default="host")
    priority: Mapped[int] = mapped_column(Integer, default=0)
    grace_seconds: Mapped[float] = mapped_column(Float, default=30.0)
    time_limit_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)  # the longest one run may last
    # a notebook: stopped (resumable) after this long without kernel or terminal activity
    idle_limit_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    restart_count: Mapped[int] = mapped_column(Integer, default=0)
    max_restarts: Mapped[int] = mapped_column(Integer, default=0)
    preemptible: Mapped[bool] = mapped_column(Boolean, default=True)
    resize_to: Mapped[int | None] = mapped_column(Integer, nullable=True)  # set by a shrink or grow
    avoid: Mapped[list] = mapped_column(default=list)  # [[node, gpu], ...] where it last failed
    # [{"kind": "nan", "metric": "loss"}, {"kind": "plateau", "metric": "val_loss", "patience": 5, "mode": "min"}]
    stop_rules: Mapped[list] = mapped_column(default=list)
    stop_reason: Mapped[str | None] = mapped_column(Text, nullable=True)  # a graceful stop was asked: why
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # when the current stop was asked (any kind): a checkpoint newer than this was saved on the way out
    stop_requested_at: Mapped[datetime | None] = mapped_column(nullable=True)
    # {"node": "n", "workers": [{"rank": 0, "node": "n", "gpus": [0], "cpus": 1.0}]}
    allocation: Mapped[dict | None] = mapped_column(nullable=True)
    # what the executor needs to find the job again after a server restart
    handle: Mapped[dict | None] = mapped_column(nullable=True)
    exit_codes: Mapped[dict | None] = mapped_column(nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    # folders a platform-made job (a replica, a comparison) reads: bound read-only in its sandbox
    read_paths: Mapped[list | None] = mapped_column(nullable=True)
    # [{"ref": "digits@2", "version_id": 7, "env": "DEEPPOD_DATA_DIGITS"}]: staged before each start
    datasets: Mapped[list] = mapped_column(default=list)
    # [{"ref": "llama-tiny@3", "version_id": 9, "env": "DEEPPOD_MODEL_LLAMA_TINY", "path": "/.../v3"}]: read-only
    models: Mapped[list] = mapped_column(default=list, server_default="[]")
    # "batch" (the default), "serve" (a deployment's replica), "evaluate" (a model comparison), "trial" (tune)
    # or "notebook" (JupyterLab, reached through the control plane: notebooks/)
    kind: Mapped[str] = mapped_column(String(16), default="batch")
    deployment_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    model_version_id: Mapped[int | None] = mapped_column(Integer, nullable=True)  # what a replica serves
    # its folder (logs, checkpoints, outputs) was removed; the record and its events stay
    purged_at: Mapped[datetime | None] = mapped_column(nullable=True)
    endpoint: Mapped[str | None] = mapped_column(String(256), nullable=True)  # a replica's URL once it listens
    params: Mapped[dict | None] = mapped_column(nullable=True)  # a trial's hyperparameters: DEEPPOD_PARAM_<NAME>
    stop_as: Mapped[str | None] = mapped_column(String(16), nullable=True)  # the state a requested stop ends in
    # since when its GPUs have been under the idle threshold (monitor/); None: busy or no GPUs
    idle_since: Mapped[datetime | None] = mapped_column(nullable=True)
    # GPU-seconds of its earlier runs, and when it last entered the queue: its service class
    attained_gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    # wall seconds of its earlier runs (started_at is the current run's, or the current size's)
    ran_seconds: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    queued_at: Mapped[datetime | None] = mapped_column(nullable=True)
    submitted_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(nullable=True)

    @property
    def placed_workers(self) -> list[dict]:
        """The workers of the current run: [{"rank", "node", "gpus", "cpus", "memory_mb"}] ([] when none)."""
        return (self.allocation or {}).get("workers", [])

    @property
    def stopping(self) -> bool:
        """Its workers are being stopped: preempted, resized, cancelled or gracefully stopped."""
        return (self.state in (JobState.PREEMPTED, JobState.RESIZING) or self.cancel_requested
                or bool(self.stop_reason))


class PlanVersion(Base):
    """Every plan ever applied; the newest is in force."""

    __tablename__ = "plans"
    id: Mapped[int] = mapped_column(primary_key=True)
    document: Mapped[dict] = mapped_column(default=dict)
    applied_by: Mapped[str] = mapped_column(String(64), default="")
    applied_at: Mapped[datetime] = mapped_column(default=utcnow)


class JobEvent(Base):
    __tablename__ = "job_events"
    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text, default="")


class JobMetric(Base):
    __tablename__ = "job_metrics"
    __table_args__ = (Index("ix_job_metrics_series", "job_id", "name", "step"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    step: Mapped[int] = mapped_column(Integer)
    value: Mapped[float | None] = mapped_column(Float, nullable=True)  # None: NaN or infinite
    at: Mapped[datetime] = mapped_column(default=utcnow)
    trial: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the trial it was reported for (a search's)


class JobHistogram(Base):
    __tablename__ = "job_histograms"
    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(256))
    step: Mapped[int] = mapped_column(Integer)
    min: Mapped[float] = mapped_column(Float)
    max: Mapped[float] = mapped_column(Float)
    counts: Mapped[list] = mapped_column(default=list)
    at: Mapped[datetime] = mapped_column(default=utcnow)


class Dataset(Base):
    __tablename__ = "datasets"
    __table_args__ = (UniqueConstraint("tenant_id", "name"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    description: Mapped[str] = mapped_column(Text, default="")
    shared: Mapped[bool] = mapped_column(Boolean, default=False)  # readable by every tenant
    tags: Mapped[dict] = mapped_column(default=dict)  # {"xray": "", "site": "lyon"}
    meta: Mapped[dict] = mapped_column(default=dict)  # free metadata
    policy: Mapped[dict] = mapped_column(default=dict)  # the ingest policy for new versions
    created_by: Mapped[int] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class DatasetVersion(Base):
    __tablename__ = "dataset_versions"
    __table_args__ = (UniqueConstraint("dataset_id", "version"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    # ingesting -> ready; a row left "ingesting" by a crash is removed with its files at start
    state: Mapped[str] = mapped_column(String(16), default="ingesting")
    tier: Mapped[str] = mapped_column(String(8), default="hot")
    key: Mapped[str] = mapped_column(String(256))  # folder under the tier root
    samples: Mapped[int] = mapped_column(Integer, default=0)
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    classes: Mapped[list] = mapped_column(default=list)
    stats: Mapped[dict] = mapped_column(default=dict)
    lineage: Mapped[dict] = mapped_column(default=dict)
    report: Mapped[dict] = mapped_column(default=dict)  # quarantined files and why
    created_by: Mapped[int] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime] = mapped_column(default=utcnow)
    # the server whose API process builds it while "ingesting": only that server's death undoes it
    ingest_server: Mapped[str | None] = mapped_column(String(32), nullable=True)


class Model(Base):
    __tablename__ = "models"
    __table_args__ = (UniqueConstraint("tenant_id", "name"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    description: Mapped[str] = mapped_column(Text, default="")
    aliases: Mapped[dict] = mapped_column(default=dict)  # {"champion": 3, "challenger": 4}
    created_by: Mapped[int] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ModelVersion(Base):
    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("model_id", "version"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    key: Mapped[str] = mapped_column(String(256))  # folder under the models root
    signature: Mapped[dict] = mapped_column(default=dict)  # input, preprocessing, classes
    metrics: Mapped[dict] = mapped_column(default=dict)
    lineage: Mapped[dict] = mapped_column(default=dict)  # job, dataset@version, hyperparameters, command
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    sha256: Mapped[str] = mapped_column(String(64), default="")  # of model.pt2
    created_by: Mapped[int] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ModelEvaluation(Base):
    """One version's figures on one dataset version, from a comparison job."""
    __tablename__ = "model_evaluations"
    id: Mapped[int] = mapped_column(primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), index=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[int] = mapped_column(Integer, index=True)
    dataset: Mapped[str] = mapped_column(String(160))  # NAME@VERSION
    samples: Mapped[int] = mapped_column(Integer, default=0)
    accuracy: Mapped[float] = mapped_column(Float, default=0.0)
    per_class: Mapped[dict] = mapped_column(default=dict)  # class -> {"samples", "accuracy", "precision", "recall"}
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ModelComparison(Base):
    """What a comparison job compares, recorded when it is created."""
    __tablename__ = "model_comparisons"
    job_id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), index=True)
    version_a_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id", ondelete="CASCADE"))
    version_b_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id", ondelete="CASCADE"))
    dataset: Mapped[str] = mapped_column(String(160))  # NAME@VERSION as asked
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Deployment(Base):
    __tablename__ = "deployments"
    __table_args__ = (UniqueConstraint("tenant_id", "name"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"), index=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id"))  # the version it should serve
    previous_version_id: Mapped[int | None] = mapped_column(Integer, nullable=True)  # for rollback
    replicas: Mapped[int] = mapped_column(Integer, default=1)
    gpus_per_replica: Mapped[int] = mapped_column(Integer, default=0)
    cpus_per_replica: Mapped[float] = mapped_column(Float, default=1.0)
    max_batch: Mapped[int] = mapped_column(Integer, default=32)
    max_wait_ms: Mapped[float] = mapped_column(Float, default=5.0)
    state: Mapped[str] = mapped_column(String(16), default="deploying")  # states.DeploymentState
    reason: Mapped[str] = mapped_column(Text, default="")
    created_by: Mapped[int] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class DeploymentKey(Base):
    """A key that may call one deployment's predict and nothing else."""
    __tablename__ = "deployment_keys"
    id: Mapped[int] = mapped_column(primary_key=True)
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(128), default="")
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(nullable=True)


class DirectToken(Base):
    """A token the control plane signed for a client to call a deployment's replicas itself
    (serve/direct.py): what it was given for, so that revoking that revokes it too."""
    __tablename__ = "direct_tokens"
    id: Mapped[int] = mapped_column(primary_key=True)
    jti: Mapped[str] = mapped_column(String(32), unique=True)
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id", ondelete="CASCADE"), index=True)
    # what the caller showed: a user token ("token") or a deployment key ("key"), by its hash
    via: Mapped[str] = mapped_column(String(8))
    credential_hash: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(index=True)
    revoked_at: Mapped[datetime | None] = mapped_column(nullable=True)


class AccessKey(Base):
    """An S3 access key (s3/access_keys.py): acts for its user, in its tenant, read-only or not.
    Its secret is derived from the server's key and the key id, so it is stored nowhere."""
    __tablename__ = "access_keys"
    id: Mapped[int] = mapped_column(primary_key=True)
    key_id: Mapped[str] = mapped_column(String(32), unique=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    # the token it was made with (None: before keys were bound to one): it ends when that does
    token_id: Mapped[int | None] = mapped_column(ForeignKey("tokens.id", ondelete="CASCADE"), nullable=True,
                                                 index=True)
    scope: Mapped[str] = mapped_column(String(8), default="write")  # read | write
    name: Mapped[str] = mapped_column(String(128), default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(nullable=True)


class AuditEvent(Base):
    """One mutating API call or failed sign-in: who, what, when, from where, the answer."""

    __tablename__ = "audit_events"
    id: Mapped[int] = mapped_column(primary_key=True)
    at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    user: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)  # None: not signed in
    tenant: Mapped[str | None] = mapped_column(String(64), nullable=True)
    token_kind: Mapped[str] = mapped_column(String(16), default="")  # user, job, key, none
    method: Mapped[str] = mapped_column(String(8))
    path: Mapped[str] = mapped_column(String(512))
    status: Mapped[int] = mapped_column(Integer)
    client: Mapped[str] = mapped_column(String(64), default="")  # the peer address


class Experiment(Base):
    """A hyperparameter search (deeppod tune): trials run as ordinary jobs of its tenant."""

    __tablename__ = "experiments"
    __table_args__ = (UniqueConstraint("tenant_id", "name"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), index=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16), default="running", index=True)  # states.ExperimentState
    metric: Mapped[str] = mapped_column(String(128))
    mode: Mapped[str] = mapped_column(String(8))  # min or max
    trials: Mapped[int] = mapped_column(Integer)  # the budget
    parallel: Mapped[int] = mapped_column(Integer)  # at most this many at once
    sampler: Mapped[str] = mapped_column(String(16))
    pruner: Mapped[str] = mapped_column(String(16))
    prune_after: Mapped[int] = mapped_column(Integer, default=1)  # the pruner's first step (its first rung)
    seed: Mapped[int | None] = mapped_column(Integer, nullable=True)
    space: Mapped[dict] = mapped_column(default=dict)
    job: Mapped[dict] = mapped_column(SealedJSON(), default=dict)  # the trial job template (its --env sealed)
    register: Mapped[str | None] = mapped_column(String(64), nullable=True)  # model name for the best trial
    registered: Mapped[str | None] = mapped_column(String(160), nullable=True)  # NAME@VERSION once registered
    register_at_chance: Mapped[bool] = mapped_column(default=False)  # register a best model no better than chance
    reuse: Mapped[bool] = mapped_column(default=False)  # a trial's process runs the next trial (runtime.trials())
    best_trial: Mapped[int | None] = mapped_column(Integer, nullable=True)  # its trial number
    reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(nullable=True)


class Trial(Base):
    """One trial of an experiment: one job (same id through preemptions and resumes)."""

    __tablename__ = "trials"
    __table_args__ = (UniqueConstraint("experiment_id", "number"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)  # the study's trial number
    study_trial_id: Mapped[int] = mapped_column(Integer)  # the study storage's trial id
    job_id: Mapped[int] = mapped_column(Integer, index=True)
    params: Mapped[dict] = mapped_column(default=dict)
    state: Mapped[str] = mapped_column(String(16), default="running")  # states.TrialState
    value: Mapped[float | None] = mapped_column(Float, nullable=True)  # the final value told to the study
    best: Mapped[float | None] = mapped_column(Float, nullable=True)  # best reported value so far
    step: Mapped[int] = mapped_column(Integer, default=-1)  # last reported step passed to the pruner
    claimed_at: Mapped[datetime | None] = mapped_column(nullable=True)  # its process took it (runtime.trials())
    turn: Mapped[int] = mapped_column(Integer, default=0)  # handed to its process again on each resume from a pause
    done_at: Mapped[datetime | None] = mapped_column(nullable=True)  # that process said it ended it
    reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(nullable=True)


class GpuSample(Base):
    """One GPU at one time (``period`` 0: a raw sample; else an average over that many seconds),
    with the job and tenant that held it."""

    __tablename__ = "gpu_samples"
    __table_args__ = (Index("ix_gpu_samples_series", "period", "node", "gpu", "at"),
                      Index("ix_gpu_samples_job", "job_id", "at"))
    id: Mapped[int] = mapped_column(primary_key=True)
    node: Mapped[str] = mapped_column(String(128))
    gpu: Mapped[int] = mapped_column(Integer)
    at: Mapped[float] = mapped_column(Float)  # epoch seconds
    period: Mapped[int] = mapped_column(Integer, default=0)
    util: Mapped[float] = mapped_column(Float, default=0.0)  # percent
    memory_used_mb: Mapped[float] = mapped_column(Float, default=0.0)
    memory_total_mb: Mapped[float] = mapped_column(Float, default=0.0)
    power_w: Mapped[float] = mapped_column(Float, default=0.0)
    temperature_c: Mapped[float] = mapped_column(Float, default=0.0)
    ecc_uncorrected: Mapped[int] = mapped_column(BigInteger, default=0)  # volatile count
    xid: Mapped[int] = mapped_column(BigInteger, default=0)  # the last Xid error seen (0: none)
    job_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tenant_id: Mapped[int | None] = mapped_column(Integer, nullable=True)


class JobSample(Base):
    """What a running job's processes used at one time (executor/usage.py): CPU seconds so far
    (a chart takes rates between samples) and resident memory."""

    __tablename__ = "job_samples"
    __table_args__ = (Index("ix_job_samples_series", "job_id", "at"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    at: Mapped[float] = mapped_column(Float)  # epoch seconds
    cpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    memory_mb: Mapped[float] = mapped_column(Float, default=0.0)


class HostSample(Base):
    __tablename__ = "host_samples"
    __table_args__ = (Index("ix_host_samples_series", "period", "node", "at"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    node: Mapped[str] = mapped_column(String(128))
    at: Mapped[float] = mapped_column(Float)
    period: Mapped[int] = mapped_column(Integer, default=0)
    cpu_percent: Mapped[float] = mapped_column(Float, default=0.0)
    memory_used_mb: Mapped[float] = mapped_column(Float, default=0.0)
    memory_total_mb: Mapped[float] = mapped_column(Float, default=0.0)
    disk_used_percent: Mapped[float] = mapped_column(Float, default=0.0)
    net_rx_bps: Mapped[float] = mapped_column(Float, default=0.0)
    net_tx_bps: Mapped[float] = mapped_column(Float, default=0.0)


class ConsoleSession(Base):
    """A web console sign-in: the browser holds the secret (an HttpOnly cookie), the row the
    token it was opened with, so revoking the token or signing out ends it."""

    __tablename__ = "console_sessions"
    id: Mapped[int] = mapped_column(primary_key=True)
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 of the cookie's value
    token_id: Mapped[int] = mapped_column(ForeignKey("tokens.id"), index=True)
    csrf: Mapped[str] = mapped_column(String(64))  # sent back by every form and htmx request
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column()
    ended_at: Mapped[datetime | None] = mapped_column(nullable=True)
