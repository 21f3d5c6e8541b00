"""Token lookups for the hot paths (predict, and every read: GET): a short-lived cache in
front of the store.

A revoked (or expired) token keeps working for at most ``ttl`` seconds on these paths, well
under the 1 s the security model promises; a change (POST, PUT, DELETE) checks the store on
each call.
An entry past half its life is looked up again in the background while it keeps answering,
so a token in steady use never waits for the store on the hot path."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from deeppod.auth.service import Principal, authenticate
from deeppod.auth.tokens import hash_secret
from deeppod.errors import Unauthenticated
from deeppod.store.models import Token, utcnow

log = logging.getLogger(__name__)


class PrincipalCache:
    def __init__(self, sessions: sessionmaker[Session], ttl: float = 0.5, max_entries: int = 10_000,
                 clock: Callable[[], float] = time.monotonic):
        self.sessions, self.ttl, self.max_entries, self.clock = sessions, ttl, max_entries, clock
        self._entries: dict[str, tuple[float, Principal | None, str]] = {}  # expiry, principal, why refused
        self._refreshing: set[str] = set()
        self._lock = threading.Lock()

    def cached(self, secret: str) -> Principal | None | bool:
        """The principal, None for a known-bad token, or False when it must be looked up."""
        hit = self._entries.get(hash_secret(secret))
        if hit is None or hit[0] < self.clock():
            return False
        return hit[1]

    def claim_refresh(self, secret: str) -> bool:
        """True (once, to one caller) when a cached entry is past half its life: that caller
        runs :meth:`refresh` off the hot path."""
        key = hash_secret(secret)
        hit = self._entries.get(key)
        if hit is None or hit[0] - self.clock() > self.ttl / 2:
            return False
        with self._lock:
            if key in self._refreshing:
                return False
            self._refreshing.add(key)
            return True

    def refresh(self, secret: str) -> None:
        try:
            self.lookup(secret)
        except Unauthenticated:
            pass  # remembered as bad: the next call is refused
        except Exception:  # the store did not answer: the entry expires, the next call looks it up
            log.exception("could not refresh a cached token")
        finally:
            with self._lock:
                self._refreshing.discard(hash_secret(secret))

    def lookup(self, secret: str) -> Principal:
        """Blocking: ask the store, remember the answer (good or bad) for ``ttl``."""
        why, until = "", self.clock() + self.ttl
        try:
            with self.sessions() as s:
                principal = authenticate(s, secret)
                expires = s.scalar(select(Token.expires_at).where(Token.token_hash == hash_secret(secret)))
            if expires is not None:  # an expiring token is not trusted past its expiry
                until = min(until, self.clock() + (expires - utcnow()).total_seconds())
        except Unauthenticated as exc:
            principal, why = None, exc.message
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[hash_secret(secret)] = (until, principal, why)
        if principal is None:
            raise Unauthenticated(why)
        return principal

    def clear(self) -> None:
        """Forget every entry: a token, user or tenant changed in this process (a revoked token
        is refused at once here; another server's change reaches this one within ``ttl``)."""
        with self._lock:
            self._entries.clear()

    def fresh(self, secret: str | None) -> Principal | None:
        """Without blocking: the principal while its entry is fresh, else None (look it up)."""
        hit = self.cached(secret) if secret else False
        return hit or None

    def get(self, secret: str | None) -> Principal:
        """Blocking: the principal, from the cache while it is fresh, else from the store."""
        if not secret:
            return authenticate(None, secret)  # says what to send
        hit = self.cached(secret)
        if hit is False:
            return self.lookup(secret)
        if hit is None:  # known bad: why, as the store said
            raise Unauthenticated(self._entries[hash_secret(secret)][2])
        return hit
