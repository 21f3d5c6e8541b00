"""Store-side inventory: register nodes and read them back for the scheduler and the API."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from deeppod.cluster.inventory import NodeInfo
from deeppod.store.models import Node, utcnow


def register_node(session: Session, info: NodeInfo) -> Node:
    node = session.scalar(select(Node).where(Node.name == info.name))
    if node is None:
        node = Node(name=info.name)
        session.add(node)
    node.address = info.address
    node.cpus = info.cpus
    node.memory_mb = info.memory_mb
    node.gpus = [g.to_dict() for g in info.gpus]
    node.healthy = info.healthy
    node.last_seen = utcnow()
    session.flush()
    return node


def list_nodes(session: Session) -> list[Node]:
    return list(session.scalars(select(Node).order_by(Node.name)))


def capacity(session: Session) -> dict:
    """Totals over healthy nodes: what the largest possible job may ask for."""
    nodes = [n for n in list_nodes(session) if n.healthy]
    return {
        "nodes": len(nodes),
        "gpus": sum(len(n.gpus) for n in nodes),
        "cpus": sum(n.cpus for n in nodes),
        "memory_mb": sum(n.memory_mb for n in nodes),
        "max_node_cpus": max((n.cpus for n in nodes), default=0),
        "max_node_memory_mb": max((n.memory_mb for n in nodes), default=0),
        "max_node_gpus": max((len(n.gpus) for n in nodes), default=0),
    }
