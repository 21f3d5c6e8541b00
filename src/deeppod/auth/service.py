"""Tenants, users and tokens. Every function takes the DB session and the caller."""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from deeppod.auth.tokens import hash_secret, new_secret
from deeppod.errors import Conflict, Forbidden, InvalidRequest, NotFound, Unauthenticated
from deeppod.store.models import Tenant, Token, User, utcnow

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
DEFAULT_TENANT = "default"
ADMIN_USER = "admin"


@dataclass(frozen=True)
class Principal:
    user_id: int
    user: str
    tenant_id: int
    tenant: str
    is_admin: bool
    job_id: int | None = None  # a job's own token: it acts for that job only where it matters

    def can_see_tenant(self, tenant_id: int) -> bool:
        return self.is_admin or tenant_id == self.tenant_id


def check_name(kind: str, name: str) -> str:
    if not NAME_RE.match(name or ""):
        raise InvalidRequest(
            f"{kind} name {name!r} is not valid: use 1-63 lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or digit")
    return name


def require_admin(principal: Principal, action: str) -> None:
    if not principal.is_admin:
        raise Forbidden(f"only an administrator can {action}; ask one, or use an admin token")


def _issue(session: Session, user: User, name: str, job_id: int | None = None) -> tuple[Token, str]:
    secret = new_secret()
    token = Token(user_id=user.id, token_hash=hash_secret(secret), name=name, job_id=job_id)
    session.add(token)
    session.flush()
    return token, secret


def bootstrap(session: Session) -> str | None:
    """On first start: the default tenant, the admin user and its token (returned once)."""
    if session.scalar(select(User.id).limit(1)) is not None:
        return None
    tenant = Tenant(name=DEFAULT_TENANT)
    session.add(tenant)
    session.flush()
    admin = User(name=ADMIN_USER, tenant_id=tenant.id, is_admin=True)
    session.add(admin)
    session.flush()
    _, secret = _issue(session, admin, "bootstrap")
    return secret


def authenticate(session: Session, secret: str | None) -> Principal:
    if not secret:
        raise Unauthenticated("this call needs a bearer token: pass 'Authorization: Bearer <token>' "
                              "(the CLI reads it from --token, DEEPPOD_TOKEN or 'deeppod login')")
    row = session.execute(
        select(Token, User, Tenant)
        .join(User, Token.user_id == User.id)
        .join(Tenant, User.tenant_id == Tenant.id)
        .where(Token.token_hash == hash_secret(secret))
    ).first()
    if row is None or row.Token.revoked_at is not None:
        raise Unauthenticated("the token is unknown or revoked: create a new one with 'deeppod tokens create'")
    return Principal(row.User.id, row.User.name, row.Tenant.id, row.Tenant.name, row.User.is_admin, row.Token.job_id)


def get_tenant(session: Session, name: str) -> Tenant:
    tenant = session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is None:
        raise NotFound(f"no tenant named {name!r}: list them with 'deeppod tenants ls'")
    return tenant


def create_tenant(session: Session, principal: Principal, name: str) -> Tenant:
    require_admin(principal, "create tenants")
    check_name("tenant", name)
    if session.scalar(select(Tenant.id).where(Tenant.name == name)) is not None:
        raise Conflict(f"tenant {name!r} already exists")
    tenant = Tenant(name=name)
    session.add(tenant)
    session.flush()
    return tenant


def list_tenants(session: Session, principal: Principal) -> list[Tenant]:
    q = select(Tenant).order_by(Tenant.name)
    if not principal.is_admin:
        q = q.where(Tenant.id == principal.tenant_id)
    return list(session.scalars(q))


def create_user(session: Session, principal: Principal, name: str, tenant: str,
                is_admin: bool = False) -> tuple[User, str]:
    """A new user and its first token (the secret is returned once)."""
    require_admin(principal, "create users")
    check_name("user", name)
    t = get_tenant(session, tenant)
    if session.scalar(select(User.id).where(User.name == name)) is not None:
        raise Conflict(f"user {name!r} already exists")
    user = User(name=name, tenant_id=t.id, is_admin=is_admin)
    session.add(user)
    session.flush()
    _, secret = _issue(session, user, "first token")
    return user, secret


def list_users(session: Session, principal: Principal) -> list[tuple[User, Tenant]]:
    q = select(User, Tenant).join(Tenant, User.tenant_id == Tenant.id).order_by(User.name)
    if not principal.is_admin:
        q = q.where(User.tenant_id == principal.tenant_id)
    return [(r.User, r.Tenant) for r in session.execute(q)]


def create_token(session: Session, principal: Principal, name: str = "",
                 user: str | None = None) -> tuple[Token, str]:
    """A token for the caller, or (admins only) for another user."""
    if user is None or user == principal.user:
        target = session.get(User, principal.user_id)
    else:
        require_admin(principal, "create tokens for other users")
        target = session.scalar(select(User).where(User.name == user))
        if target is None:
            raise NotFound(f"no user named {user!r}: list them with 'deeppod users ls'")
    return _issue(session, target, name[:128])


def list_tokens(session: Session, principal: Principal) -> list[Token]:
    q = select(Token).where(Token.user_id == principal.user_id, Token.job_id.is_(None),
                            Token.revoked_at.is_(None)).order_by(Token.id)
    return list(session.scalars(q))


def revoke_token(session: Session, principal: Principal, token_id: int) -> Token:
    token = session.get(Token, token_id)
    if token is None:
        raise NotFound(f"no token with id {token_id}: list yours with 'deeppod tokens ls'")
    if token.user_id != principal.user_id and not principal.is_admin:
        raise Forbidden("you can only revoke your own tokens")
    if token.revoked_at is None:
        token.revoked_at = utcnow()
    return token


def issue_job_token(session: Session, user_id: int, job_id: int) -> str:
    """A token that lets a running job call the API as its owner; revoked when it ends."""
    user = session.get(User, user_id)
    _, secret = _issue(session, user, f"job {job_id}", job_id=job_id)
    return secret


def revoke_job_tokens(session: Session, job_id: int) -> None:
    for token in session.scalars(select(Token).where(Token.job_id == job_id, Token.revoked_at.is_(None))):
        token.revoked_at = utcnow()
