"""The control plane's side of predict: who may call, which replica answers.

Routes (deployment -> replicas that take traffic) are set by the controller; the balancer
picks the replica with the fewest requests in flight and forwards the body as is. A
replica that refuses the connection or drops it (it was stopped, it crashed) is skipped
for a moment and the request goes to another: predict is a pure function, so a retry is
safe, and it is what keeps a rolling update from failing requests.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from deeppod.contract import REPLICA_SECRET_HEADER
from deeppod.deployments.upstream import Upstream
from deeppod.errors import NoReplica, UpstreamError
from deeppod.serve.metrics import LATENCY_BUCKETS, Counter, Histogram, merge
from deeppod.states import DeploymentState

log = logging.getLogger(__name__)
SUSPECT_SECONDS = 2.0
RETRY_BUDGET_SECONDS = 15.0
HISTORY_STEP_S = 5.0  # a deployment's totals are kept this often (taken by the controller's rounds)
HISTORY_S = 600.0  # and this long: what the console's traffic charts span, so a page opened late is not empty


@dataclass(frozen=True)
class Target:
    job_id: int
    url: str
    version: int
    secret: str = field(default="", repr=False)  # what the replica asks of its callers (contract.ENV_REPLICA_SECRET)


@dataclass
class Route:
    deployment_id: int
    tenant_id: int
    name: str
    model: str
    targets: tuple[Target, ...] = ()
    state: str = DeploymentState.DEPLOYING


@dataclass
class Answer:
    status: int
    body: bytes
    content_type: str
    replica: Target | None = None


@dataclass
class _Stats:
    requests: Counter = field(default_factory=lambda: Counter("deeppod_router_requests_total",
                                                              "Predict requests through the router by status."))
    latency: Histogram = field(default_factory=lambda: Histogram(
        "deeppod_router_latency_seconds", "Predict latency seen by the router, retries included.", LATENCY_BUCKETS))
    retries: Counter = field(default_factory=lambda: Counter("deeppod_router_retries_total",
                                                             "Requests sent again to another replica."))
    direct: Counter = field(default_factory=lambda: Counter(
        "deeppod_direct_requests_total", "Predictions sent to replicas directly, with a direct token, by status "
                                         "(as the replicas report them, within a second)."))
    direct_seconds: Counter = field(default_factory=lambda: Counter(
        "deeppod_direct_seconds_total", "Time replicas spent answering direct predictions."))
    history: deque = field(default_factory=lambda: deque(maxlen=int(HISTORY_S / HISTORY_STEP_S) + 1))

    def totals(self) -> dict:
        """The running totals, direct predictions included (a page turns them into rates); the
        latency buckets are the router's alone."""
        by_code: dict[str, float] = {}
        for counter in (self.requests, self.direct):
            for k, v in counter.values.items():
                code = dict(k).get("code", "")
                by_code[code] = by_code.get(code, 0.0) + v
        direct = sum(self.direct.values.values())
        return {"requests": sum(by_code.values()), "direct": direct,
                "errors": sum(v for code, v in by_code.items() if not code.startswith("2")),
                "latency_sum": self.latency.sum + self.direct_seconds.get(),
                "latency_count": self.latency.count + direct,
                "buckets": list(self.latency.buckets), "counts": list(self.latency.counts),
                "retries": self.retries.get()}


class Balancer:
    def __init__(self, timeout: float = 60.0, clock: Callable[[], float] = time.time):
        self.routes: dict[int, Route] = {}
        self.by_name: dict[tuple[int, str], int] = {}
        self.keys: dict[str, int] = {}  # key hash -> deployment id
        self.inflight: dict[int, int] = {}  # job id -> requests on it now
        self.suspect: dict[int, float] = {}  # job id -> skip until
        self.stats: dict[int, _Stats] = {}
        self.timeout, self.clock = timeout, clock
        self._rr = itertools.count()
        self._client: httpx.AsyncClient | None = None  # the replicas' /metrics (rare)
        self._loop = None
        self._upstream: Upstream | None = None  # predict: the hot path
        self._upstream_loop = None

    # set by the controller (another thread): whole-object swaps, so readers never see half
    def set_routes(self, routes: list[Route], keys: dict[str, int]) -> None:
        self.routes = {r.deployment_id: r for r in routes}
        self.by_name = {(r.tenant_id, r.name): r.deployment_id for r in routes}
        self.keys = keys

    def find(self, tenant_id: int, name: str) -> Route | None:
        dep_id = self.by_name.get((tenant_id, name))
        return self.routes.get(dep_id) if dep_id is not None else None

    def load(self, job_id: int) -> int:
        return self.inflight.get(job_id, 0)

    def _upstream_for_loop(self) -> Upstream:
        loop = asyncio.get_running_loop()
        if self._upstream is None or self._upstream_loop is not loop:
            self._upstream = Upstream(timeout=self.timeout)
            self._upstream_loop = loop
        return self._upstream

    def _client_for_loop(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout, connect=2.0),
                                             limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256))
            self._loop = loop
        return self._client

    def _pick(self, route: Route, tried: set[int]) -> Target | None:
        now = time.monotonic()
        live = [t for t in route.targets if t.job_id not in tried and self.suspect.get(t.job_id, 0) <= now]
        if not live:
            live = [t for t in route.targets if t.job_id not in tried]
        if not live:
            return None
        start = next(self._rr) % len(live)
        ordered = live[start:] + live[:start]  # ties go round-robin
        return min(ordered, key=lambda t: self.inflight.get(t.job_id, 0))

    async def forward(self, dep_id: int, path_query: str, body: bytes, content_type: str) -> Answer:
        """Send to a replica of the deployment's current route; on a dropped connection or a
        replica that is going away, try another, within a time budget."""
        stats = self.stats.setdefault(dep_id, _Stats())
        began = time.monotonic()
        tried: set[int] = set()
        answer = None
        try:
            while True:
                route = self.routes.get(dep_id)  # re-read: the route may change while we retry
                if route is None:
                    raise NoReplica("the deployment was removed")
                target = self._pick(route, tried)
                if target is None:
                    if time.monotonic() - began > RETRY_BUDGET_SECONDS or not route.targets:
                        raise NoReplica(f"deployment {route.name!r} has no healthy replica ({route.state}); "
                                        f"see 'deeppod deploy show {route.name}'")
                    tried.clear()
                    await asyncio.sleep(0.05)
                    continue
                self.inflight[target.job_id] = self.inflight.get(target.job_id, 0) + 1
                try:
                    r = await self._upstream_for_loop().post(target.url, path_query, body, content_type,
                                                             secret=target.secret)
                except UpstreamError as exc:
                    log.info("replica %s (%s) dropped a request (%s); trying another", target.job_id, target.url, exc)
                    self.suspect[target.job_id] = time.monotonic() + SUSPECT_SECONDS
                    tried.add(target.job_id)
                    stats.retries.inc()
                    continue
                finally:
                    self.inflight[target.job_id] -= 1
                if r.status == 503:  # shutting down
                    tried.add(target.job_id)
                    stats.retries.inc()
                    continue
                answer = Answer(r.status, r.body, r.headers.get("content-type", "application/json"), target)
                return answer
        finally:
            stats.requests.inc(code=str(answer.status if answer else 503))
            stats.latency.observe(time.monotonic() - began)

    def render_metrics(self, dep_id: int, name: str) -> str:
        stats = self.stats.get(dep_id)
        if stats is None:
            return ""
        lines = []
        for m in (stats.requests, stats.latency, stats.retries, stats.direct, stats.direct_seconds):
            lines += m.render({"deployment": name})
        return "\n".join(lines) + "\n"

    def count_direct(self, dep_id: int, usage: list[dict]) -> None:
        """What replicas report of direct predictions: the same totals as the router's."""
        stats = self.stats.setdefault(dep_id, _Stats())
        for u in usage:
            for code, n in u["codes"].items():
                stats.direct.inc(n, code=code)
            stats.direct_seconds.inc(u["seconds"])

    def keep_history(self) -> None:
        """Keep each routed deployment's totals, at most every HISTORY_STEP_S and for HISTORY_S:
        the controller calls this every round, traffic or not, so the points are evenly spaced."""
        now = self.clock()
        for dep_id in list(self.routes):
            history = self.stats.setdefault(dep_id, _Stats()).history
            if not history or now - history[-1][0] >= HISTORY_STEP_S:
                history.append((now, self.stats[dep_id].totals()))

    def traffic(self, dep_id: int) -> dict:
        """The router's running totals for one deployment now (``at``, this server's clock), and
        as kept over the last HISTORY_S (``history``, oldest first)."""
        stats = self.stats.get(dep_id) or _Stats()
        now = self.clock()
        return {**stats.totals(), "at": now,
                "history": [{**t, "at": at} for at, t in stats.history if now - at <= HISTORY_S]}

    async def replica_metrics(self, dep_id: int) -> str:
        route = self.routes.get(dep_id)
        if route is None:
            return ""
        client = self._client_for_loop()

        async def one(t: Target) -> str:
            try:
                r = await client.get(t.url + "/metrics", timeout=2.0, headers={REPLICA_SECRET_HEADER: t.secret})
                return r.text if r.status_code == 200 else ""
            except httpx.TransportError:
                return ""

        return merge(list(await asyncio.gather(*(one(t) for t in route.targets))))
