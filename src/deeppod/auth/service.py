"""Tenants, users and tokens. Every function takes the DB session and the caller."""

from __future__ import annotations

import re
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from deeppod.auth import roles, scope
from deeppod.auth.principal import Principal
from deeppod.auth.tokens import hash_secret, new_secret
from deeppod.errors import Conflict, Forbidden, InvalidRequest, NotFound, Unauthenticated
from deeppod.scheduler.plan import parse_plan
from deeppod.store.models import PlanVersion, Tenant, Token, User, utcnow

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
DEFAULT_TENANT = "default"
ADMIN_USER = "admin"


def check_name(kind: str, name: str) -> str:
    if not NAME_RE.match(name or ""):
        raise InvalidRequest(
            f"{kind} name {name!r} is not valid: use 1-63 lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or digit")
    return name


def require_admin(principal: Principal, action: str) -> None:
    if not principal.is_admin:
        raise Forbidden(f"only an administrator can {action}; ask one, or use an admin token")


def managed_tenants(session: Session, principal: Principal) -> set[str] | None:
    """The tenants whose users, tokens and plan the caller administers: None for all
    (admins), its tenant and those below its node in the plan (tenant admins), none else."""
    if principal.role == roles.ADMIN:
        return None
    if principal.role != roles.TENANT_ADMIN:
        return set()
    row = session.scalar(select(PlanVersion).order_by(PlanVersion.id.desc()).limit(1))
    names = {principal.tenant}
    if row is not None:
        for node, parent, _ in parse_plan(row.document).walk():
            if parent in names:
                names.add(node.name)
    return names


def _require_manager(session: Session, principal: Principal, tenant: str, action: str) -> None:
    managed = managed_tenants(session, principal)
    if managed is not None and tenant not in managed:
        raise Forbidden(f"only an administrator (or tenant {tenant!r}'s tenant admin) can {action}")


def _require_over(session: Session, principal: Principal, user: User, action: str) -> None:
    """The caller administers ``user``: admins anyone, tenant admins the non-admins of their tenants."""
    _require_manager(session, principal, session.get(Tenant, user.tenant_id).name, f"{action} user {user.name!r}")
    if user.is_admin:
        require_admin(principal, f"{action} an administrator")


def _issue(session: Session, user: User, name: str, job_id: int | None = None, scope: str = roles.ALL,
           expires_at=None) -> tuple[Token, str]:
    secret = new_secret()
    token = Token(user_id=user.id, token_hash=hash_secret(secret), name=name, job_id=job_id, scope=scope,
                  expires_at=expires_at)
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
    admin = User(name=ADMIN_USER, tenant_id=tenant.id, role=roles.ADMIN)
    session.add(admin)
    session.flush()
    _, secret = _issue(session, admin, "bootstrap")
    return secret


def authenticate(session: Session, secret: str | None) -> Principal:
    if not secret:
        raise Unauthenticated("this call needs a bearer token: pass 'Authorization: Bearer <token>' "
                              "(the CLI reads it from --token, DEEPPOD_TOKEN or 'deeppod login')")
    row = _tokens(session, [hash_secret(secret)]).first()
    if row is None or row.Token.revoked_at is not None:
        raise Unauthenticated("the token is unknown or revoked: create a new one with 'deeppod tokens create'")
    if row.Token.expires_at is not None and row.Token.expires_at <= utcnow():
        raise Unauthenticated(f"the token expired at {row.Token.expires_at:%Y-%m-%d %H:%M} UTC: "
                              "create a new one with 'deeppod tokens create'")
    return principal_of(row.User, row.Tenant, row.Token)


def _tokens(session: Session, token_hashes):
    return session.execute(select(Token, User, Tenant).join(User, Token.user_id == User.id)
                           .join(Tenant, User.tenant_id == Tenant.id).where(Token.token_hash.in_(token_hashes)))


def live_principals(session: Session, token_hashes) -> dict[str, Principal]:
    """Who the tokens of these hashes act for, those that :func:`authenticate` still takes
    (not revoked, not expired): for what was handed out on a token's strength (direct tokens)."""
    now = utcnow()
    return {tok.token_hash: principal_of(user, tenant, tok) for tok, user, tenant in _tokens(session, token_hashes)
            if tok.revoked_at is None and (tok.expires_at is None or tok.expires_at > now)}


def principal_of(user: User, tenant: Tenant, token: Token | None = None) -> Principal:
    """Who acts: a user of a tenant, through a token (None: the platform acting for the user)."""
    return Principal(user.id, user.name, tenant.id, tenant.name, user.is_admin,
                     token.job_id if token else None, user.role, token.scope if token else roles.ALL,
                     token.id if token else None, token.expires_at if token else None)


def get_tenant(session: Session, name: str) -> Tenant:
    tenant = session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is None:
        raise NotFound(f"no tenant named {name!r}: list them with 'deeppod tenants ls'")
    return tenant


def create_tenant(session: Session, principal: Principal, name: str, *, isolated: bool = True) -> Tenant:
    """``isolated``: whether this server keeps tenants' jobs apart (else it holds one tenant)."""
    require_admin(principal, "create tenants")
    check_name("tenant", name)
    if session.scalar(select(Tenant.id).where(Tenant.name == name)) is not None:
        raise Conflict(f"tenant {name!r} already exists")
    if not isolated:
        raise Conflict("this server does not isolate tenants (its jobs run as its own OS identity and could read "
                       "each other's work), so it holds one tenant; restart it with --isolation sandbox (root, "
                       "Linux namespaces; docs/security.md), or with --single-user if every user trusts every other")
    tenant = Tenant(name=name)
    session.add(tenant)
    session.flush()
    return tenant


def list_tenants(session: Session, principal: Principal) -> list[Tenant]:
    return list(session.scalars(scope.tenants(select(Tenant).order_by(Tenant.name), principal)))


def create_user(session: Session, principal: Principal, name: str, tenant: str,
                role: str = roles.MEMBER) -> tuple[User, str]:
    """A new user and its first token (the secret is returned once). Admins make any role;
    tenant admins make non-admins in their subtree."""
    roles.check_role(role)
    _require_manager(session, principal, tenant, f"create users in tenant {tenant!r}")
    if role == roles.ADMIN:
        require_admin(principal, "create administrators")
    check_name("user", name)
    t = get_tenant(session, tenant)
    if session.scalar(select(User.id).where(User.name == name)) is not None:
        raise Conflict(f"user {name!r} already exists")
    user = User(name=name, tenant_id=t.id, role=role)
    session.add(user)
    session.flush()
    _, secret = _issue(session, user, "first token")
    return user, secret


def set_role(session: Session, principal: Principal, name: str, role: str) -> tuple[User, Tenant]:
    """Change a user's role; it holds from the user's next call (predict: within 0.5 s)."""
    roles.check_role(role)
    user = session.scalar(select(User).where(User.name == name))
    if user is None:
        raise NotFound(f"no user named {name!r}: list them with 'deeppod users ls'")
    if user.id == principal.user_id:
        raise Forbidden("you cannot change your own role; ask another administrator")
    _require_over(session, principal, user, "change the role of")
    if role == roles.ADMIN:
        require_admin(principal, "make administrators")
    user.role = role
    return user, session.get(Tenant, user.tenant_id)


def list_users(session: Session, principal: Principal) -> list[tuple[User, Tenant]]:
    q = select(User, Tenant).join(Tenant, User.tenant_id == Tenant.id).order_by(User.name)
    managed = managed_tenants(session, principal)
    if managed is not None:
        q = q.where(Tenant.name.in_(managed | {principal.tenant}))
    return [(r.User, r.Tenant) for r in session.execute(q)]


def create_token(session: Session, principal: Principal, name: str = "", user: str | None = None, *,
                 scope: str = roles.ALL, expires_in: float | None = None) -> tuple[Token, str]:
    """A token for the caller, or (admins, and tenant admins in their subtree) for another
    user; with a scope (roles.SCOPES) and, if ``expires_in`` seconds are given, an expiry."""
    roles.check_scope(scope)
    if expires_in is not None and not 60 <= expires_in <= 5 * 366 * 86400:
        raise InvalidRequest("a token's lifetime must be between 1 minute and 5 years")
    if user is None or user == principal.user:
        target = session.get(User, principal.user_id)
    else:
        target = session.scalar(select(User).where(User.name == user))
        if target is None:
            raise NotFound(f"no user named {user!r}: list them with 'deeppod users ls'")
        _require_over(session, principal, target, "create tokens for")
    expires_at = utcnow() + timedelta(seconds=expires_in) if expires_in is not None else None
    return _issue(session, target, name[:128], scope=scope, expires_at=expires_at)


def list_tokens(session: Session, principal: Principal) -> list[Token]:
    q = select(Token).where(Token.user_id == principal.user_id, Token.job_id.is_(None),
                            Token.revoked_at.is_(None)).order_by(Token.id)
    return list(session.scalars(q))


def revoke_token(session: Session, principal: Principal, token_id: int) -> Token:
    token = session.get(Token, token_id)
    if token is None:
        raise NotFound(f"no token with id {token_id}: list yours with 'deeppod tokens ls'")
    if token.user_id != principal.user_id:
        _require_over(session, principal, session.get(User, token.user_id), "revoke the tokens of")
    if token.revoked_at is None:
        token.revoked_at = utcnow()
    return token


def issue_job_token(session: Session, user_id: int, job_id: int, scope: str = roles.ALL) -> str:
    """A token that lets a running job call its own job's routes as its owner (``scope``
    roles.REPLICA: only announce its replica); revoked when the job ends."""
    user = session.get(User, user_id)
    _, secret = _issue(session, user, f"job {job_id}", job_id=job_id, scope=scope)
    return secret


def revoke_job_tokens(session: Session, job_id: int) -> None:
    for token in session.scalars(select(Token).where(Token.job_id == job_id, Token.revoked_at.is_(None))):
        token.revoked_at = utcnow()
