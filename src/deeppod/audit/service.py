"""Reading the audit log (admins) and keeping it within its retention."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from deeppod.auth.service import Principal, require_admin
from deeppod.store.models import AuditEvent, utcnow


@dataclass
class AuditFilter:
    user: str | None = None
    since: datetime | None = None
    failed: bool = False  # only refusals and errors (status >= 400)
    path: str | None = None  # a part of the path


def query(session: Session, principal: Principal, where: AuditFilter | None = None,
          limit: int = 200) -> list[AuditEvent]:
    """Newest first."""
    require_admin(principal, "read the audit log")
    f = where or AuditFilter()
    q = select(AuditEvent).order_by(AuditEvent.id.desc()).limit(limit)
    if f.user:
        q = q.where(AuditEvent.user == f.user)
    if f.since:
        q = q.where(AuditEvent.at >= f.since)
    if f.failed:
        q = q.where(AuditEvent.status >= 400)
    if f.path:
        q = q.where(AuditEvent.path.contains(f.path, autoescape=True))
    return list(session.scalars(q))


def apply_retention(session: Session, days: float, now: datetime | None = None) -> int:
    """DEEPPOD_AUDIT_RETENTION_DAYS: drop older events (0 keeps all); how many went."""
    if days <= 0:
        return 0
    cutoff = (now or utcnow()) - timedelta(days=days)
    return session.execute(delete(AuditEvent).where(AuditEvent.at < cutoff)).rowcount or 0
