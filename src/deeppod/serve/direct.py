"""Direct predict: a client calls a deployment's replicas itself, with a token the control
plane signed, so predictions skip the control plane's hop (issue 45: the hop cost 5-18% of
throughput on a shared 2-core machine). The control plane keeps the say:

- it signs a token only for a caller that may predict on the deployment (a tenant token or a
  deployment key), for minutes, with the deployment's own key (every replica of the
  deployment has it; no other deployment's token opens with it);
- every replica reports to it, every ``SYNC_SECONDS`` (``IDLE_SYNC_SECONDS`` while no direct
  token comes), how many predictions each token made and
  which were refused (its rates, its audit), and hears back which tokens it revoked: a revoked
  user token or deployment key stops its direct tokens within a second;
- a replica that has not heard from the control plane for ``STALE_SECONDS`` refuses direct
  tokens (503) until it does: the client goes through the platform's endpoint meanwhile.

Token: ``dpd1.`` + base64url(JSON claims) + ``.`` + base64url(HMAC-SHA256(key, the part
before the dot)). Claims: ``d`` deployment id, ``j`` token id, ``e`` expiry (Unix seconds),
``t`` tenant, ``u`` who asked. Imports no server code (it runs in the replica).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import logging
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

from deeppod.contract import DIRECT_TOKEN_PREFIX, server_urls, tls_context

log = logging.getLogger(__name__)

SYNC_SECONDS = 0.5  # a revocation reaches the replica within this and one sync's round trip
IDLE_SYNC_SECONDS = 0.8  # when no direct token came for BUSY_SECONDS: less load on the control plane
BUSY_SECONDS = 60.0
STALE_SECONDS = 2.0
MAX_REFUSALS_KEPT = 100  # per report: a flood of bad tokens is counted, not listed


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign(key: bytes, claims: dict) -> str:
    body = DIRECT_TOKEN_PREFIX + _b64(json.dumps(claims, separators=(",", ":"), sort_keys=True).encode())
    return body + "." + _b64(hmac.new(key, body.encode(), hashlib.sha256).digest())


def open_token(key: bytes, token: str) -> dict | None:
    """The claims of a token signed with ``key``; None for anything else (no time check here)."""
    if not token.startswith(DIRECT_TOKEN_PREFIX) or token.count(".") != 2:
        return None
    body, _, sig = token.rpartition(".")
    try:
        good = hmac.compare_digest(_unb64(sig), hmac.new(key, body.encode(), hashlib.sha256).digest())
        claims = json.loads(_unb64(body[len(DIRECT_TOKEN_PREFIX):])) if good else None
    except (ValueError, TypeError):
        return None
    if not isinstance(claims, dict) or not all(isinstance(claims.get(k), (int, str)) for k in "dje"):
        return None
    return claims


@dataclass(frozen=True)
class Refusal:
    status: int
    code: str
    message: str


@dataclass
class _Use:
    codes: dict[str, int] = field(default_factory=dict)  # HTTP status -> answers
    seconds: float = 0.0

    def add(self, codes: dict[str, int], seconds: float) -> None:
        for code, n in codes.items():
            self.codes[code] = self.codes.get(code, 0) + n
        self.seconds += seconds


@dataclass
class _Report:
    usage: dict[str, _Use] = field(default_factory=dict)
    refused: list[dict] = field(default_factory=list)
    refused_count: int = 0


class DirectAccess:
    """A replica's side: checks tokens, counts their use, syncs with the control plane."""

    def __init__(self, key: bytes, deployment_id: int, *, clock=time.time, monotonic=time.monotonic):
        self.key, self.deployment_id = key, deployment_id
        self.clock, self.monotonic = clock, monotonic
        self.revoked: frozenset[str] = frozenset()
        self.synced_at: float | None = None  # monotonic time of the last answer
        self._lock = threading.Lock()
        self._report = _Report()
        self._failing = False  # logged once per outage, not at every sync
        self._seen_at = -BUSY_SECONDS  # monotonic time a direct token last came

    def check(self, authorization: str, client: str = "") -> tuple[dict | None, Refusal | None]:
        self._seen_at = self.monotonic()
        token = authorization[7:].strip() if authorization[:7].lower() == "bearer " else ""
        claims = open_token(self.key, token) if token else None
        if claims is None or claims["d"] != self.deployment_id:
            return None, self._refuse(None, 401, "unauthenticated", "this replica takes its control plane's "
                                      "secret or a direct token of its own deployment: get one with POST "
                                      "/v1/deployments/NAME/direct", client)
        if claims["e"] <= self.clock():
            return None, self._refuse(claims, 401, "token_expired", "the direct token expired: get a new one "
                                      "with POST /v1/deployments/NAME/direct", client)
        if claims["j"] in self.revoked:
            return None, self._refuse(claims, 401, "token_revoked", "the direct token was revoked (or the token "
                                      "or key it was given for)", client)
        if self.synced_at is None or self.monotonic() - self.synced_at > STALE_SECONDS:
            return None, Refusal(503, "direct_paused", "this replica cannot reach its control plane to check "
                                 "revocations: call POST /v1/deployments/NAME/predict on the server meanwhile")
        return claims, None

    def _refuse(self, claims: dict | None, status: int, code: str, message: str, client: str) -> Refusal:
        with self._lock:
            r = self._report
            r.refused_count += 1
            if len(r.refused) < MAX_REFUSALS_KEPT:
                r.refused.append({"jti": claims["j"] if claims else None, "user": claims.get("u") if claims else None,
                                  "status": status, "code": code, "client": client[:64]})
        return Refusal(status, code, message)

    def used(self, jti: str, status: int, seconds: float) -> None:
        with self._lock:
            self._report.usage.setdefault(jti, _Use()).add({str(status): 1}, seconds)

    def take_report(self) -> dict:
        with self._lock:
            r, self._report = self._report, _Report()
        return {"usage": [{"jti": j, "codes": u.codes, "seconds": round(u.seconds, 6)} for j, u in r.usage.items()],
                "refused": r.refused, "refused_count": r.refused_count}

    def give_back(self, report: dict) -> None:
        """A report the control plane did not take: counted again in the next one."""
        with self._lock:
            for u in report["usage"]:
                self._report.usage.setdefault(u["jti"], _Use()).add(u["codes"], u["seconds"])
            self._report.refused = (report["refused"] + self._report.refused)[:MAX_REFUSALS_KEPT]
            self._report.refused_count += report["refused_count"]

    def apply(self, answer: dict) -> None:
        self.revoked = frozenset(answer.get("revoked") or ())
        self.synced_at = self.monotonic()

    def sync_once(self, post) -> bool:
        """One report and its answer through ``post(report) -> answer``; False when it failed."""
        report = self.take_report()
        try:
            answer = post(report)
        except Exception as exc:  # the control plane restarting, or a failover: keep counting, retry
            if not self._failing:
                log.warning("direct tokens: cannot sync with the control plane (%s); retrying", exc)
            self._failing = True
            self.give_back(report)
            return False
        if self._failing:
            log.info("direct tokens: in sync with the control plane again")
        self._failing = False
        self.apply(answer)
        return True

    def interval(self) -> float:
        busy = self.monotonic() - self._seen_at < BUSY_SECONDS
        return SYNC_SECONDS if busy else IDLE_SYNC_SECONDS

    def run(self, post, stop: threading.Event) -> None:
        while not stop.is_set():
            began = self.monotonic()
            self.sync_once(post)
            stop.wait(max(0.0, self.interval() - (self.monotonic() - began)))


class ControlPlane:
    """A replica's syncs over one kept-alive connection to the first server that answers (a
    failover pair: the other one when it does not). A new connection per sync, as
    ``runtime.registry.api_call`` makes, cost the replica's HTTP thread the GIL for longer."""

    def __init__(self, api_url: str, token: str, job_id: str, *, cafile: str | None = None, timeout: float = 5.0):
        self.urls, self.cafile, self.timeout = server_urls(api_url), cafile, timeout
        self.path = f"/v1/replicas/{job_id}/direct"
        self.headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        self._conn: http.client.HTTPConnection | None = None
        self._base = 0  # which of self.urls the connection is to

    def _connect(self, base: str) -> http.client.HTTPConnection:
        u = urllib.parse.urlsplit(base)
        if u.scheme == "https":
            return http.client.HTTPSConnection(u.hostname, u.port, timeout=self.timeout,
                                               context=tls_context(base, self.cafile))
        return http.client.HTTPConnection(u.hostname, u.port, timeout=self.timeout)

    def post(self, report: dict) -> dict:
        body = json.dumps(report).encode()
        last: Exception | None = None
        for n in range(len(self.urls)):
            i = (self._base + n) % len(self.urls)
            if self._conn is None or i != self._base:
                self.close()
                self._conn, self._base = self._connect(self.urls[i]), i
            for attempt in range(2):  # a kept connection the server closed while idle: once more
                try:
                    self._conn.request("POST", self.path, body, self.headers)
                    r = self._conn.getresponse()
                    data = r.read()
                    break
                except (OSError, http.client.HTTPException) as exc:
                    last = exc
                    self._conn.close()
            else:
                continue
            if r.status >= 400:
                raise RuntimeError(f"the server answered {r.status}: {data[:300].decode(errors='replace')}")
            return json.loads(data)
        self.close()
        raise RuntimeError(f"no server answered ({last})")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
