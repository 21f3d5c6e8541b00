"""Apply and show resource plans. The semantics live in ``deeppod.scheduler.plan``."""

from __future__ import annotations

import threading
import weakref
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from deeppod.auth import roles
from deeppod.auth.service import Principal, require_admin
from deeppod.cluster.service import capacity
from deeppod.contract import ACTIVE_STATES, JobState
from deeppod.errors import Forbidden, InvalidRequest
from deeppod.scheduler.plan import Plan, parse_plan
from deeppod.store.models import Job, Node, PlanVersion, Tenant


def current_plan(session: Session) -> tuple[Plan, PlanVersion | None]:
    row = session.scalar(select(PlanVersion).order_by(PlanVersion.id.desc()).limit(1))
    return (_parsed_once(session, row.id, lambda: row.document) if row else Plan()), row


def plan_now(session: Session) -> Plan:
    """The plan in force (:func:`current_plan` without its row), asking the store only for
    the newest version's id while that version is known."""
    latest = session.scalar(select(PlanVersion.id).order_by(PlanVersion.id.desc()).limit(1))
    if latest is None:
        return Plan()
    return _parsed_once(session, latest, lambda: session.scalar(select(PlanVersion.document)
                                                                 .where(PlanVersion.id == latest)))


# A stored plan version never changes: each is parsed once per database (engine), not on
# every submit and scheduling round.
_parsed: weakref.WeakKeyDictionary[Engine, dict[int, Plan]] = weakref.WeakKeyDictionary()
_parsed_lock = threading.Lock()


def _parsed_once(session: Session, version_id: int, document: Callable[[], object]) -> Plan:
    """Version ``version_id`` parsed, from memory when it is the one parsed last; ``document``
    reads it from the store otherwise."""
    engine = session.get_bind()
    with _parsed_lock:
        known = _parsed.setdefault(engine, {})
        if version_id in known:
            return known[version_id]
    plan = parse_plan(document())
    with _parsed_lock:
        known.clear()  # only the newest is asked for
        known[version_id] = plan
    return plan


def apply_plan(session: Session, principal: Principal, document: object) -> PlanVersion:
    """Validate and store a new plan; the next scheduling round honours it. Tenant admins may
    change only what lies below their tenant's node (its sub-tenants)."""
    if principal.role != roles.TENANT_ADMIN:
        require_admin(principal, "apply a resource plan")
    plan = parse_plan(document, cluster_gpus=capacity(session)["gpus"])
    if principal.role == roles.TENANT_ADMIN:
        current, _ = current_plan(session)
        if principal.tenant not in {node.name for node, _, _ in current.walk()}:
            raise Forbidden(f"tenant {principal.tenant!r} has no node in the plan to change below; "
                            "ask an administrator")
        if _pruned(plan.to_dict(), principal.tenant) != _pruned(current.to_dict(), principal.tenant):
            raise Forbidden(f"a tenant admin changes only the plan below tenant {principal.tenant!r} (its children); "
                            "everything else, its own node's figures included, must stay as it is")
    known = set(session.scalars(select(Tenant.name)))
    missing = [name for name in plan.leaves() if name not in known]
    if missing:
        raise InvalidRequest(f"the plan names tenant(s) that do not exist: {', '.join(missing)}; "
                             "create them first with 'deeppod tenants create NAME' (groups need children)")
    row = PlanVersion(document=plan.to_dict(), applied_by=principal.user)
    session.add(row)
    session.flush()
    return row


def _pruned(doc, name: str):
    """``doc`` (a plan's to_dict) with the children of node ``name`` left out."""
    if isinstance(doc, list):
        return [_pruned(d, name) for d in doc]
    if isinstance(doc, dict):
        if doc.get("name") == name:
            return {k: v for k, v in doc.items() if k != "children"}
        return {k: _pruned(v, name) for k, v in doc.items()}
    return doc


@dataclass
class TenantStatus:
    name: str
    parent: str | None
    depth: int
    guaranteed: int
    max: int | None
    lend_limit: int | None
    weight: float
    in_use: int
    borrowed: int
    lent: int
    waiting: int  # GPUs queued jobs need to start


def plan_status(session: Session, principal: Principal) -> list[TenantStatus]:
    plan, _ = current_plan(session)
    use: dict[str, int] = defaultdict(int)
    wait: dict[str, int] = defaultdict(int)
    rows = session.execute(select(Job, Tenant.name).join(Tenant, Job.tenant_id == Tenant.id)
                           .where(Job.state.in_(ACTIVE_STATES)))
    burst = set(session.scalars(select(Node.name).where(Node.burst.is_not(None))))  # outside the plan's arithmetic
    for job, tenant in rows:
        if job.state == JobState.QUEUED:
            wait[tenant] += job.workers * job.gpus_per_worker
        else:
            use[tenant] += sum(len(w["gpus"]) for w in job.placed_workers if w["node"] not in burst)
    out: list[TenantStatus] = []
    seen = set()
    for node, parent, depth in plan.walk():
        seen.add(node.name)
        out.append(TenantStatus(node.name, parent, depth, node.guaranteed, node.max, node.lend_limit, node.weight,
                                0, 0, 0, 0))
    for name in sorted(set(use) | set(wait)):
        if name not in seen:
            out.append(TenantStatus(name, None, 0, 0, None, None, 1.0, 0, 0, 0, 0))
    by_name = {s.name: s for s in out}
    for s in out:  # leaves carry usage; groups add up their subtree
        if s.name in use or s.name in wait:
            cur: TenantStatus | None = s
            while cur is not None:
                cur.in_use += use.get(s.name, 0)
                cur.waiting += wait.get(s.name, 0)
                cur = by_name.get(cur.parent) if cur.parent else None
    for s in out:
        s.borrowed = max(0, s.in_use - s.guaranteed)
    # Borrowed GPUs come first from capacity nobody is guaranteed, then from idle guarantees.
    tops = [s for s in out if s.depth == 0]
    borrowed = sum(s.borrowed for s in tops)
    unguaranteed = max(0, capacity(session)["gpus"] - sum(s.guaranteed for s in tops))
    from_tenants = max(0, borrowed - unguaranteed)
    idle = {s.name: max(0, s.guaranteed - s.in_use) if s.lend_limit is None else
            min(max(0, s.guaranteed - s.in_use), s.lend_limit) for s in tops}
    total_idle = sum(idle.values())
    for s in tops:
        if total_idle and from_tenants:
            s.lent = min(idle[s.name], round(from_tenants * idle[s.name] / total_idle))
    if not principal.is_admin:
        mine = principal.tenant
        keep = {mine}
        cur = by_name.get(mine)
        while cur is not None and cur.parent:
            keep.add(cur.parent)
            cur = by_name.get(cur.parent)
        out = [s for s in out if s.name in keep]
    return out
