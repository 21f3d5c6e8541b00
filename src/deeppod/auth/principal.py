"""Who is asking: a user of a tenant, acting through a token (or a job through its own), with a
role. Every service takes one and applies the tenant rule (auth/scope.py) with it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from deeppod.auth import roles


@dataclass(frozen=True)
class Principal:
    user_id: int
    user: str
    tenant_id: int
    tenant: str
    is_admin: bool
    job_id: int | None = None  # a job's own token: only its job's routes (roles.JOB_ROUTES)
    role: str = ""  # roles.ROLES; when given, is_admin follows it; empty: admin or member, as is_admin says
    scope: str = roles.ALL
    # the token it acts through (None: the platform acting for the user), and when that token ends:
    # what is made on its strength (an S3 access key) ends with it
    token_id: int | None = None
    token_expires_at: datetime | None = None

    def __post_init__(self) -> None:
        if self.role:
            object.__setattr__(self, "is_admin", self.role == roles.ADMIN)
        else:
            object.__setattr__(self, "role", roles.ADMIN if self.is_admin else roles.MEMBER)

    def can_see_tenant(self, tenant_id: int | None) -> bool:
        """The tenant rule for one tenant id (auth/scope.py applies it to queries and rows)."""
        return self.is_admin or tenant_id == self.tenant_id

    def may_manage(self, user_id: int) -> bool:
        """Whether the caller may change what ``user_id`` (of a tenant it can see) owns."""
        return self.role in (roles.ADMIN, roles.TENANT_ADMIN) or user_id == self.user_id
