"""Direct tokens, the control plane's side (the replica's is serve/direct.py): who gets one,
what it was given for, and which are revoked.

A token is given to whoever may call the deployment's predict (a token of its tenant that
may predict, or one of its keys) and is bound to that credential: when the credential is
revoked, expires, or loses the right to predict, the token is revoked at the next replica
sync. Asking again with the same credential while its token has more than half its life
left gets the same token, so a client that asks on every call does not pile up tokens.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from deeppod.auth import roles, scope
from deeppod.auth.service import Principal, authenticate, live_principals
from deeppod.auth.tokens import hash_secret
from deeppod.deployments import service
from deeppod.deployments.direct_key import deployment_key
from deeppod.errors import Conflict, DeepPodError, Forbidden, InvalidRequest, Unauthenticated
from deeppod.jobs import service as jobs
from deeppod.serve.direct import sign
from deeppod.store.models import Deployment, DeploymentKey, DirectToken, Tenant, utcnow

TTL_SECONDS = 600
MAX_TTL_SECONDS = 24 * 3600
KEEP_EXPIRED = timedelta(days=1)  # then the row goes (the audit log keeps who asked)


@dataclass(frozen=True)
class Issued:
    token: str
    jti: str
    expires_at: float  # Unix seconds
    deployment: Deployment


def _caller(session: Session, name: str, key: str, secret: str) -> tuple[Deployment, str, str, Principal | None]:
    """The deployment and what opened it: ``(dep, via, credential hash, principal or None)``."""
    if key or secret.startswith(service.KEY_PREFIX):
        row = session.scalar(select(DeploymentKey).where(DeploymentKey.key_hash == hash_secret(key or secret),
                                                         DeploymentKey.revoked_at.is_(None)))
        dep = session.get(Deployment, row.deployment_id) if row is not None else None
        if dep is None or dep.name != name:
            raise Unauthenticated(f"this key is unknown, revoked, or not a key of deployment {name!r}")
        return dep, "key", row.key_hash, None
    if not secret:
        raise Unauthenticated("a direct token needs a token of the tenant ('Authorization: Bearer ...') or a "
                              "deployment key ('X-DeepPod-Key: ...')")
    principal = authenticate(session, secret)
    roles.check_predict(principal)
    return service.get(session, principal, name), "token", hash_secret(secret), principal


def issue(session: Session, name: str, *, key: str = "", secret: str = "",
          ttl: float = TTL_SECONDS) -> tuple[Issued, Principal | None]:
    if not 1 <= ttl <= MAX_TTL_SECONDS:
        raise InvalidRequest(f"ttl_seconds must be between 1 and {MAX_TTL_SECONDS} (got {ttl:g})")
    dep, via, cred, principal = _caller(session, name, key, secret)
    now = utcnow()
    session.execute(delete(DirectToken).where(DirectToken.expires_at < now - KEEP_EXPIRED))
    live = session.scalar(select(DirectToken).where(
        DirectToken.deployment_id == dep.id, DirectToken.credential_hash == cred, DirectToken.revoked_at.is_(None),
        DirectToken.expires_at > now + timedelta(seconds=ttl / 2)).order_by(DirectToken.expires_at.desc()).limit(1))
    if live is None:
        live = DirectToken(jti=secrets.token_hex(12), deployment_id=dep.id, via=via, credential_hash=cred,
                           user_id=principal.user_id if principal else None, created_at=now,
                           expires_at=now + timedelta(seconds=ttl))
        session.add(live)
        session.flush()
    tenant = session.get(Tenant, dep.tenant_id)
    expires = int(live.expires_at.timestamp())
    claims = {"d": dep.id, "j": live.jti, "e": expires, "t": tenant.name,
              "u": principal.user if principal else f"key:{live.credential_hash[:8]}"}
    return Issued(sign(deployment_key(dep.id), claims), live.jti, expires, dep), principal


def revoke_all(session: Session, principal: Principal, name: str) -> int:
    """Every live direct token of the deployment, now (its replicas hear of it within a second)."""
    dep = service.get(session, principal, name)
    rows = list(session.scalars(select(DirectToken).where(
        DirectToken.deployment_id == dep.id, DirectToken.revoked_at.is_(None), DirectToken.expires_at > utcnow())))
    for row in rows:
        row.revoked_at = utcnow()
    return len(rows)


def _still_valid(session: Session, dep: Deployment, rows: list[DirectToken]) -> set[str]:
    """The credential hashes of ``rows`` that may still predict on ``dep``."""
    keys = {r.credential_hash for r in rows if r.via == "key"}
    tokens = {r.credential_hash for r in rows if r.via == "token"}
    ok = set(session.scalars(select(DeploymentKey.key_hash).where(
        DeploymentKey.key_hash.in_(keys), DeploymentKey.deployment_id == dep.id,
        DeploymentKey.revoked_at.is_(None)))) if keys else set()
    for token_hash, principal in (live_principals(session, tokens) if tokens else {}).items():
        try:
            roles.check_predict(principal)
        except DeepPodError:
            continue
        if scope.owns(principal, dep):
            ok.add(token_hash)
    return ok


def sync(session: Session, principal: Principal, job_id: int) -> tuple[Deployment, list[str]]:
    """A replica's sync (with its job's token): its deployment, and the direct tokens revoked
    and not yet expired. A token whose credential no longer holds is revoked here."""
    if principal.job_id != job_id:
        raise Forbidden(f"only replica {job_id} itself (with its job's token) may sync its direct tokens")
    job = jobs.get_job(session, principal, job_id)
    if job.kind != "serve" or job.deployment_id is None:
        raise Conflict(f"job {job_id} is not a deployment replica")
    dep = session.get(Deployment, job.deployment_id)
    if dep is None:
        raise Conflict(f"replica {job_id}'s deployment was removed")
    now = utcnow()
    rows = list(session.scalars(select(DirectToken).where(DirectToken.deployment_id == dep.id,
                                                          DirectToken.expires_at > now)))
    live = [r for r in rows if r.revoked_at is None]
    valid = _still_valid(session, dep, live) if live else set()
    for r in live:
        if r.credential_hash not in valid:
            r.revoked_at = now
    return dep, sorted(r.jti for r in rows if r.revoked_at is not None)
