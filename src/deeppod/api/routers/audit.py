from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Query, Request

from deeppod.api.deps import PrincipalDep, SessionDep, get_ctx
from deeppod.api.schemas.audit import AuditEventOut
from deeppod.audit import service

router = APIRouter(prefix="/v1/audit", tags=["audit"])


@router.get("", response_model=list[AuditEventOut])
def query(session: SessionDep, principal: PrincipalDep, request: Request,
          user: str | None = Query(None, max_length=64, description="only this user's calls"),
          since: datetime | None = Query(None, description="only events at or after this time (ISO 8601)"),
          failed: bool = Query(False, description="only refused or failed calls (status 400 and above)"),
          path: str | None = Query(None, max_length=512, description="only paths containing this"),
          limit: int = Query(200, ge=1, le=10000)) -> list[AuditEventOut]:
    """Mutating API calls and failed sign-ins, newest first (administrators only)."""
    get_ctx(request).audit.flush()  # what was just done is in the answer
    where = service.AuditFilter(user=user, since=since, failed=failed, path=path)
    return [AuditEventOut.model_validate(e) for e in service.query(session, principal, where, limit)]
