"""What bursting costs and holds now, against the plan in force: each burst type's nodes up and
asked for, each tenant's charges, each budget's spending (``GET /v1/burst``, ``deeppod nodes``,
the console)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from deeppod.cluster.burst import NO_AUTOSCALER, charges, spent_by_tenant
from deeppod.plans.service import plan_now
from deeppod.scheduler.burst import Ask
from deeppod.scheduler.plan import Plan
from deeppod.store.models import Node


@dataclass
class BurstStatus:
    """What bursting costs and holds now (``GET /v1/burst``, ``deeppod nodes``, the console)."""

    types: list[dict]  # each plan burst type: its figures, nodes up, nodes asked for and why
    charges: list[dict]  # per tenant and burst type: seconds of nodes and their cost
    budgets: list[dict]  # each plan node with a burst budget: what it spent



def burst_status(s: Session, principal, asks: dict[str, Ask] | None) -> BurstStatus:
    """Administrators see every tenant's charges; others their own tenant's only. ``asks``:
    the leader's last asks ({} on a standby, or before its first round); None: this server
    has no autoscaler (the local executor), so no burst node is ever added."""
    if asks is None:
        asks = {}
        none = NO_AUTOSCALER
    else:
        none = ""
    plan = plan_now(s)
    up: dict[str, int] = {}
    for kind in s.scalars(select(Node.burst).where(Node.burst.is_not(None), Node.up.is_(True))):
        up[kind] = up.get(kind, 0) + 1
    types = [{**b.to_dict(), "nodes_up": up.get(b.name, 0),
              "nodes_asked": asks[b.name].nodes if b.name in asks else None,
              "reason": asks[b.name].reason if b.name in asks else none} for b in plan.burst]
    rows: dict[tuple[str, str], dict] = {}
    for c in charges(s):
        if not principal.is_admin and c.tenant != principal.tenant:
            continue
        r = rows.setdefault((c.tenant, c.node_type), {"tenant": c.tenant, "node_type": c.node_type, "nodes": 0,
                                                       "seconds": 0.0, "cost": 0.0})
        r["nodes"] += 1
        r["seconds"] += c.seconds
        r["cost"] += c.cost
    spent = spent_by_tenant(s)
    budgets = []
    for node, _parent, _ in plan.walk():
        if node.burst_budget is None:
            continue
        below = [m.name for m, _, _ in Plan((node,)).walk()]
        if principal.is_admin or principal.tenant in below:
            budgets.append({"tenant": node.name, "budget": node.burst_budget,
                            "spent": round(sum(spent.get(m, 0.0) for m in below), 4)})
    return BurstStatus(types, sorted(rows.values(), key=lambda r: (r["tenant"], r["node_type"])), budgets)
