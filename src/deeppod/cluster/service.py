"""Store-side inventory: register nodes and read them back for the scheduler and the API."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from deeppod.auth.service import Principal, require_admin
from deeppod.cluster.gpus import gpu_memory_of
from deeppod.cluster.inventory import NodeInfo
from deeppod.contract import HOLDING_STATES
from deeppod.errors import InvalidRequest, NotFound
from deeppod.store.models import Job, Node, utcnow


def register_node(session: Session, info: NodeInfo) -> Node:
    node = session.scalar(select(Node).where(Node.name == info.name))
    if node is None:
        node = Node(name=info.name, joined_at=utcnow())
        session.add(node)
        node.healthy = info.healthy
    # An administrator's cordon of the node or of single GPUs survives re-registration.
    sick = {g["index"] for g in (node.gpus or []) if not g.get("healthy", True)}
    node.address = info.address
    node.cpus = info.cpus
    node.memory_mb = info.memory_mb
    node.gpus = [{**g.to_dict(), "healthy": g.index not in sick} for g in info.gpus]
    node.burst = info.burst
    node.up = True
    node.down_reason = None
    node.last_seen = utcnow()
    session.flush()
    return node


def sync_nodes(session: Session, infos: Iterable[NodeInfo], names_kept: bool = False) -> list[str]:
    """Make the store's nodes what the executor reports: alive ones registered (a new one
    appears by itself), the others marked down. Returns the names newly marked down.
    ``names_kept``: a node's name is its cluster's for good (Slurm's nodes), so one that was
    down and is up again is taken back; else (Ray: a node that comes back has a new id) a node
    once lost stays down. A node the cluster reports and calls unhealthy keeps its reason
    (``NodeInfo.reason``: Slurm's state and Reason) in ``down_reason``, cleared when it is back."""
    infos = list(infos)
    alive = {i.name: i for i in infos if i.healthy}
    down = set() if names_kept else set(session.scalars(select(Node.name).where(Node.up.is_(False))))
    for info in alive.values():
        if info.name not in down:
            register_node(session, info)
    said = {i.name: i.reason for i in infos if not i.healthy}  # why, where the cluster says (Slurm)
    gone = []
    for node in session.scalars(select(Node).where(Node.name.not_in(list(alive)))):
        if node.up:
            node.up = False
            gone.append(node.name)
        if node.name in said:
            node.down_reason = said[node.name] or None
    session.flush()
    return gone


def list_nodes(session: Session) -> list[Node]:
    return list(session.scalars(select(Node).order_by(Node.name)))


@dataclass
class NodeUsage:
    """What the workers placed on a node hold now."""

    gpus: set[int]
    cpus: float = 0.0
    memory_mb: int = 0
    workers: int = 0


def usage(session: Session) -> dict[str, NodeUsage]:
    """Per node name: the GPUs, CPUs and memory held by running (or stopping) jobs' workers."""
    return usage_of(session.scalars(select(Job).where(Job.state.in_(HOLDING_STATES))))


def usage_of(jobs: Iterable[Job]) -> dict[str, NodeUsage]:
    """What these jobs' placed workers hold, per node name, with the memory of their warm
    spares (runtime/spare.py: a parked process as big as a worker, on rank 0's node; it
    holds no GPU and, parked, no CPU)."""
    out: dict[str, NodeUsage] = {}
    for job in jobs:
        workers = job.placed_workers
        for w in workers:
            u = out.setdefault(w["node"], NodeUsage(set()))
            u.gpus.update(w["gpus"])
            u.cpus += w["cpus"]
            u.memory_mb += w["memory_mb"]
            u.workers += 1
        spares = (job.allocation or {}).get("spares") or 0
        if spares and workers:
            out[workers[0]["node"]].memory_mb += spares * workers[0]["memory_mb"]
    return out


def capacity(session: Session) -> dict:
    """Totals over the cluster's own healthy nodes: what the largest possible job may ask
    for. Burst nodes, which come and go, are not counted (nor are they guaranteed to anyone)."""
    # columns, not Node rows: asked on every submit
    nodes = session.execute(select(Node.gpus, Node.cpus, Node.memory_mb)
                            .where(Node.healthy.is_(True), Node.up.is_(True), Node.burst.is_(None))).all()
    gpu_memory = [gpu_memory_of(n.gpus) for n in nodes if any(g.get("healthy", True) for g in n.gpus)]
    return {
        "nodes": len(nodes),
        "gpus": sum(1 for n in nodes for g in n.gpus if g.get("healthy", True)),
        "cpus": sum(n.cpus for n in nodes),
        "memory_mb": sum(n.memory_mb for n in nodes),
        "max_node_cpus": max((n.cpus for n in nodes), default=0),
        "max_node_memory_mb": max((n.memory_mb for n in nodes), default=0),
        "max_node_gpus": max((len(n.gpus) for n in nodes), default=0),
        # what each GPU of the best node has (0 where a node's GPUs do not say: then any request fits)
        "max_gpu_memory_mb": max(gpu_memory, default=0), "gpu_memory_unknown": 0 in gpu_memory,
        # the fewest CPUs per GPU on any GPU node: a GPU worker's default CPU request fits everywhere
        "cpus_per_gpu": min((n.cpus / len(n.gpus) for n in nodes if n.gpus), default=None),
    }


def set_health(session: Session, principal: Principal, name: str, healthy: bool, gpu: int | None = None) -> Node:
    """Cordon (healthy=False) or uncordon a node, or one of its GPUs. Jobs on a cordoned
    node or GPU are requeued elsewhere; nothing new is placed there."""
    require_admin(principal, "cordon nodes")
    node = session.scalar(select(Node).where(Node.name == name))
    if node is None:
        raise NotFound(f"no node named {name!r}: list them with 'deeppod nodes'")
    if gpu is None:
        node.healthy = healthy
        return node
    if gpu not in {g["index"] for g in node.gpus}:
        raise InvalidRequest(f"node {name} has no GPU {gpu}; it has {', '.join(str(g['index']) for g in node.gpus)}")
    set_gpu_health(node, gpu, healthy)
    return node


def set_gpu_health(node: Node, index: int, healthy: bool, reason: str = "") -> None:
    """One GPU into or out of the pool; ``reason`` says why it is out."""
    def changed(g: dict) -> dict:
        g = {k: v for k, v in g.items() if k != "reason"}
        return {**g, "healthy": healthy, **({"reason": reason} if reason and not healthy else {})}
    node.gpus = [changed(g) if g["index"] == index else g for g in node.gpus]


def mark_down(session: Session, names: Iterable[str]) -> None:
    """Nodes the executor lost under a job: nothing more is placed there."""
    for node in session.scalars(select(Node).where(Node.name.in_(list(names)))):
        node.up = False
