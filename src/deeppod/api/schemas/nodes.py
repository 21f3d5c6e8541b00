from datetime import datetime

from deeppod.api.schemas.base import Out, Strict
from deeppod.cluster.gpus import gpu_memory_of


class NodeHealth(Strict):
    healthy: bool
    gpu: int | None = None


class NodeOut(Out):
    name: str
    address: str
    gpus: list[dict]
    cpus: int
    memory_mb: int
    healthy: bool  # False: cordoned
    up: bool = True  # False: the executor lost it (a Ray node that left)
    down_reason: str | None = None  # why it is down, in its cluster's words (Slurm's state and Reason)
    last_seen: datetime
    gpus_used: int = 0  # held by running jobs' workers
    gpus_free: int = 0  # healthy and not held
    cpus_used: float = 0.0
    memory_mb_used: int = 0
    workers: int = 0
    gpu_memory_mb: int = 0  # what a job may count on from each of its healthy GPUs; 0: not known (logical slots)
    burst: str | None = None  # a burst node's type; None: one of the cluster's own


def node_out(node, use) -> NodeOut:
    """A node with what running jobs hold on it (``use``: cluster.service.NodeUsage or None)."""
    held = use.gpus if use else set()
    healthy = {g["index"] for g in node.gpus if g.get("healthy", True)} if node.healthy and node.up else set()
    return NodeOut.model_validate({
        **{c: getattr(node, c) for c in ("name", "address", "gpus", "cpus", "memory_mb", "healthy", "up",
                                   "down_reason", "last_seen", "burst")},
        "gpus_used": len(held), "gpus_free": len(healthy - held), "cpus_used": round(use.cpus, 3) if use else 0.0,
        "memory_mb_used": use.memory_mb if use else 0, "workers": use.workers if use else 0,
        "gpu_memory_mb": gpu_memory_of(node.gpus)})
