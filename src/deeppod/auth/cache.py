"""Token lookups for the hot path (predict): a short-lived cache in front of the store.

A revoked (or expired) token keeps working for at most ``ttl`` seconds on this path, well
under the 1 s the security model promises; every other route checks the store on each call.
An entry past half its life is looked up again in the background while it keeps answering,
so a token in steady use never waits for the store on the hot path."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from deeppod.auth.service import Principal, authenticate
from deeppod.auth.tokens import hash_secret
from deeppod.errors import Unauthenticated

log = logging.getLogger(__name__)


class PrincipalCache:
    def __init__(self, sessions: sessionmaker[Session], ttl: float = 0.5, max_entries: int = 10_000,
                 clock: Callable[[], float] = time.monotonic):
        self.sessions, self.ttl, self.max_entries, self.clock = sessions, ttl, max_entries, clock
        self._entries: dict[str, tuple[float, Principal | None]] = {}
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
        try:
            with self.sessions() as s:
                principal = authenticate(s, secret)
        except Unauthenticated:
            principal = None
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[hash_secret(secret)] = (self.clock() + self.ttl, principal)
        if principal is None:
            raise Unauthenticated("the token is unknown or revoked: create a new one with 'deeppod tokens create', "
                                  "or use a deployment key ('deeppod deploy key create NAME')")
        return principal
