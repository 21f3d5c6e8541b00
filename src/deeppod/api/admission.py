"""Admission: at most as many requests inside the app at once as the database pool can serve.

Past that, a request waits its turn (briefly, without a thread) and, if no turn comes within
``wait_s``, gets a fast ``503 busy`` with ``Retry-After`` before anything was done, so any
request may be repeated (the CLI and SDK do, with backoff). Without it, a burst beyond the
pool turned into threads blocked on connections for the pool's whole timeout, then failures
and dropped connections.

Paths that touch no database, or hold a turn for long, pass by: /healthz (it must answer
fast under any load), the console's static files, a job's log stream (it reads in short
sessions of its own), and S3 (a transfer streams for as long as the object takes; its
database work is a short session of its own, and a key's lookup is cached).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from deeppod.errors import Busy

log = logging.getLogger(__name__)


def _passes(path: str) -> bool:
    return path == "/healthz" or path.startswith("/static/") or (path.startswith("/v1/jobs/")
                                                                  and path.endswith("/logs")) or path.startswith("/s3")


class Admission:
    """ASGI middleware: ``slots`` requests at a time; the rest wait up to ``wait_s`` seconds,
    then a 503 (``on_shed`` is told)."""

    def __init__(self, app, slots: int, wait_s: float, on_shed=None):
        self.app, self.slots, self.wait_s = app, slots, wait_s
        self._on_shed = on_shed  # called for each 503 (the /metrics counter)
        self._free = asyncio.Semaphore(slots)
        self.shed = 0  # answered 503 (for /metrics and tests)
        self._said = 0.0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or _passes(scope.get("path", "")):
            return await self.app(scope, receive, send)
        if self._free.locked():  # full: wait a while for a turn (wait_for costs a task: only here)
            try:
                await asyncio.wait_for(self._free.acquire(), self.wait_s)
            except TimeoutError:
                return await self._busy(send)
        else:
            await self._free.acquire()  # free: no wait
        try:
            await self.app(scope, receive, send)
        finally:
            self._free.release()

    async def _busy(self, send) -> None:
        self.shed += 1
        if self._on_shed is not None:
            self._on_shed()
        now = time.monotonic()
        if now - self._said > 10:  # said once in a while, not per request
            self._said = now
            log.warning("busy: %d requests in progress and more waited %.1f s; answering 503 (%d so far)",
                        self.slots, self.wait_s, self.shed)
        err = Busy(f"the server is busy ({self.slots} requests in progress): retry in {Busy.retry_after} s "
                   "(the CLI and SDK do by themselves)")
        body = json.dumps({"error": err.to_dict()}).encode()
        await send({"type": "http.response.start", "status": err.status,
                    "headers": [(b"content-type", b"application/json"), (b"retry-after",
                                                                         str(Busy.retry_after).encode()),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
