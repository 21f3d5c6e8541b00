"""S3 access keys: an id and a secret an S3 client signs with, acting for one user in its
tenant, read-only (GET, HEAD, LIST) or read-write. The secret is the server key's HMAC of the
key id (store/sealed.derive): shown once, stored nowhere, the same on both servers of a
failover pair. A key stops working when revoked, when it expires, or when its user is gone."""

from __future__ import annotations

import base64
import secrets
import string
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from deeppod.auth import roles, scope
from deeppod.auth.service import Principal, principal_of
from deeppod.errors import Forbidden, InvalidRequest, NotFound, S3Error
from deeppod.store import sealed
from deeppod.store.models import AccessKey, Tenant, Token, User, utcnow

READ, WRITE = "read", "write"
SCOPES = (READ, WRITE)
PREFIX = "DPK"  # every DeepPod access key id starts so: a key pasted in the wrong place is recognisable
_ALPHABET = string.ascii_uppercase + string.digits


def secret_of(key_id: str) -> str:
    return base64.b64encode(sealed.derive("s3-access-key:" + key_id)).decode()[:40]


@dataclass(frozen=True)
class KeyHolder:
    """Who an access key acts for, and whether it may write."""

    principal: Principal
    key_id: str
    writes: bool


def create(session: Session, principal: Principal, *, scope: str = WRITE, name: str = "",
           expires_in: float | None = None) -> tuple[AccessKey, str]:
    """A new key for the caller; its secret (shown once)."""
    if scope not in SCOPES:
        raise InvalidRequest(f"scope {scope!r}: an access key is 'read' (GET, HEAD, LIST) or 'write' (also PUT, "
                             "DELETE, uploads)")
    if principal.job_id is not None:
        raise Forbidden("a job's token cannot create access keys; use your own token")
    if scope == WRITE and (principal.scope == roles.READ or principal.role == roles.VIEWER):
        raise Forbidden("a read-only token or a viewer can create read-only keys only: "
                        "choose scope read (--scope read)")
    expires = utcnow() + timedelta(seconds=expires_in) if expires_in else None
    if principal.token_expires_at is not None:  # never past the token it is made with
        expires = min(expires or principal.token_expires_at, principal.token_expires_at)
    key = AccessKey(key_id=PREFIX + "".join(secrets.choice(_ALPHABET) for _ in range(17)), user_id=principal.user_id,
                    token_id=principal.token_id, scope=scope, name=name, expires_at=expires)
    session.add(key)
    session.flush()
    return key, secret_of(key.key_id)


def list_keys(session: Session, principal: Principal) -> list[AccessKey]:
    """The caller's keys, newest first (revoked ones too, marked)."""
    return list(session.scalars(select(AccessKey).where(AccessKey.user_id == principal.user_id)
                                .order_by(AccessKey.id.desc())))


def revoke(session: Session, principal: Principal, key_id: str) -> AccessKey:
    key = session.scalar(select(AccessKey).where(AccessKey.key_id == key_id))
    owner = session.get(User, key.user_id) if key is not None else None
    if key is None or not (key.user_id == principal.user_id or principal.is_admin or
                           (principal.role == roles.TENANT_ADMIN and scope.owns(principal, owner))):
        raise NotFound(f"no access key {key_id!r} of yours: 'deeppod keys ls' lists them")
    if key.revoked_at is None:
        key.revoked_at = utcnow()
    return key


def holder(session: Session, key_id: str) -> tuple[KeyHolder, str]:
    """Who the key acts for and its secret; S3's InvalidAccessKeyId when it does not hold."""
    row = session.execute(select(AccessKey, User, Tenant, Token).join(User, AccessKey.user_id == User.id)
                          .join(Tenant, User.tenant_id == Tenant.id)
                          .outerjoin(Token, AccessKey.token_id == Token.id).where(AccessKey.key_id == key_id)).first()
    if row is None or row.AccessKey.revoked_at is not None:
        raise S3Error("InvalidAccessKeyId", "the access key id you provided does not exist in our records, or it "
                      "was revoked: create one with 'deeppod keys create'")
    made_with = row.Token
    if made_with is not None and (made_with.revoked_at is not None or
                                  (made_with.expires_at is not None and made_with.expires_at <= utcnow())):
        raise S3Error("InvalidAccessKeyId", "the token this access key was made with was revoked or expired, and "
                      "the key with it: create a new key with a token that holds ('deeppod keys create')")
    if row.AccessKey.expires_at is not None and row.AccessKey.expires_at <= utcnow():
        raise S3Error("InvalidAccessKeyId", f"the access key expired at {row.AccessKey.expires_at:%Y-%m-%d %H:%M} "
                      "UTC: create a new one with 'deeppod keys create'")
    p = principal_of(row.User, row.Tenant)
    writes = row.AccessKey.scope == WRITE and p.role != roles.VIEWER
    return KeyHolder(p, key_id, writes), secret_of(key_id)
