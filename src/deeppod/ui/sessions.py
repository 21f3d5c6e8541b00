"""Console sign-ins. A user signs in with a token; the browser then holds a random session
secret in an HttpOnly cookie, and the database the session's row: which token opened it, its
CSRF secret, when it ends. Every page request re-checks the token (revoked or expired ends
the session), so the console never sees more than the token may through the API."""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from deeppod.auth.service import Principal, authenticate, principal_of
from deeppod.auth.tokens import hash_secret
from deeppod.errors import Forbidden, Unauthenticated
from deeppod.store.models import ConsoleSession, Tenant, Token, User, utcnow

LIFETIME = timedelta(hours=12)


@dataclass(frozen=True)
class SignedIn:
    principal: Principal
    csrf: str
    expires_at: object


def sign_in(session: Session, token_secret: str) -> tuple[str, SignedIn]:
    """A new console session for ``token_secret``: (the cookie's secret, who signed in)."""
    token_secret = (token_secret or "").strip()
    if not token_secret:
        raise Unauthenticated("paste a token: 'deeppod tokens create' makes one, and the server printed the "
                              "admin's on its first start")
    principal = authenticate(session, token_secret)
    if principal.job_id is not None:
        raise Forbidden("a job's own token cannot sign in to the console: use your user token")
    token = session.scalar(select(Token).where(Token.token_hash == hash_secret(token_secret)))
    secret, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(24)
    expires = utcnow() + LIFETIME
    if token.expires_at is not None:
        expires = min(expires, token.expires_at)
    session.add(ConsoleSession(secret_hash=hash_secret(secret), token_id=token.id, csrf=csrf, expires_at=expires))
    return secret, SignedIn(principal, csrf, expires)


def signed_in(session: Session, secret: str | None) -> SignedIn:
    """Who holds this cookie; Unauthenticated when nobody does any more."""
    if not secret:
        raise Unauthenticated("sign in first")
    row = session.execute(
        select(ConsoleSession, Token, User, Tenant)
        .join(Token, ConsoleSession.token_id == Token.id)
        .join(User, Token.user_id == User.id)
        .join(Tenant, User.tenant_id == Tenant.id)
        .where(ConsoleSession.secret_hash == hash_secret(secret))).first()
    now = utcnow()
    if row is None or row.ConsoleSession.ended_at is not None or row.ConsoleSession.expires_at <= now:
        raise Unauthenticated("your console session ended: sign in again")
    if row.Token.revoked_at is not None or (row.Token.expires_at is not None and row.Token.expires_at <= now):
        raise Unauthenticated("the token you signed in with was revoked or expired: sign in with a new one")
    return SignedIn(principal_of(row.User, row.Tenant, row.Token), row.ConsoleSession.csrf,
                    row.ConsoleSession.expires_at)


def sign_out(session: Session, secret: str | None) -> None:
    if secret:
        row = session.scalar(select(ConsoleSession).where(ConsoleSession.secret_hash == hash_secret(secret)))
        if row is not None and row.ended_at is None:
            row.ended_at = utcnow()


def csrf_ok(expected: str, given: str | None) -> bool:
    return bool(given) and hmac.compare_digest(expected.encode(), given.encode())
