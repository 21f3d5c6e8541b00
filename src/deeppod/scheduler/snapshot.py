"""The values the policy reads (a snapshot) and returns (decisions)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class NodeState:
    name: str
    free_gpus: tuple[int, ...]  # GPU indices not allocated to any running job
    free_cpus: float
    free_memory_mb: int
    healthy: bool = True


@dataclass(frozen=True)
class PendingJob:
    id: int
    tenant: str
    workers: int
    gpus_per_worker: int = 0
    cpus_per_worker: float = 1.0
    memory_mb_per_worker: int = 0
    priority: int = 0
    submitted_at: float = 0.0


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[NodeState, ...]
    queued: tuple[PendingJob, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class WorkerPlacement:
    rank: int
    node: str
    gpus: tuple[int, ...]
    cpus: float
    memory_mb: int


@dataclass(frozen=True)
class Start:
    job_id: int
    placement: tuple[WorkerPlacement, ...]
    reason: str = ""
