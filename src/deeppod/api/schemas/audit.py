from datetime import datetime

from deeppod.api.schemas.base import Out


class AuditEventOut(Out):
    id: int
    at: datetime
    user: str | None
    tenant: str | None
    token_kind: str
    method: str
    path: str
    status: int
    client: str
