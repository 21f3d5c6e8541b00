"""The tenant rule, in one place: which rows of a tenant-owned table a principal may see.

Every service query over a table with a ``tenant_id`` (jobs, datasets, models, deployments,
experiments, users, GPU samples) that runs for a caller goes through one of these, so the rule
is written once; ``tests/auth/test_scope.py`` reads the services and fails on a query that
does not (a forgotten copy of the rule would be a leak across tenants).
"""

from __future__ import annotations

from typing import Any, TypeVar

from deeppod.auth.principal import Principal
from deeppod.store.models import Tenant

Q = TypeVar("Q")


def visible(query: Q, owner: Any, principal: Principal, *, shared: Any = None) -> Q:
    """``query`` kept to the rows of ``owner`` (a tenant-owned ORM class, or an alias of one)
    the principal may see: every row for an administrator, else its own tenant's, and the rows
    ``shared`` (a column condition) marks as shared with everyone."""
    if principal.is_admin:
        return query
    mine = owner.tenant_id == principal.tenant_id
    return query.where(mine if shared is None else mine | shared)  # type: ignore[attr-defined]


def own(query: Q, owner: Any, principal: Principal) -> Q:
    """The principal's own tenant's rows of ``owner``, for administrators too (names are per tenant)."""
    return of_tenant(query, owner, principal.tenant_id)


def of_tenant(query: Q, owner: Any, tenant_id: int) -> Q:
    """``query`` kept to one tenant's rows of ``owner`` (S3's buckets are the caller's tenant's)."""
    return query.where(owner.tenant_id == tenant_id)  # type: ignore[attr-defined]


def tenants(query: Q, principal: Principal) -> Q:
    """A query over tenants kept to those the principal may see: all, or its own."""
    return query if principal.is_admin else query.where(Tenant.id == principal.tenant_id)  # type: ignore[attr-defined]


def may_see(principal: Principal, row: Any, *, shared: bool = False) -> bool:
    """An administrator sees any row; anyone else its own tenant's, or one shared with everyone."""
    return principal.can_see_tenant(row.tenant_id) or shared


def owns(principal: Principal, row: Any) -> bool:
    """Whether ``row`` is the principal's own tenant's (administrators included: see ``own``)."""
    return row.tenant_id == principal.tenant_id
