"""Carries out the rollout policy for every deployment, a round at a time: reads the
store, checks replicas' health, asks rollout.decide, then submits, cancels and routes."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from deeppod.contract import ACTIVE_STATES, ENV_REPLICA_SECRET
from deeppod.deployments import rollout, service
from deeppod.deployments.balancer import Balancer, Route, Target
from deeppod.errors import DeepPodError
from deeppod.jobs import service as jobs
from deeppod.loops import IDLE, run_ticks
from deeppod.store.models import Deployment, Job, Model, ModelVersion

log = logging.getLogger(__name__)
UNHEALTHY_AFTER = 3  # failed checks in a row before a routed replica leaves the route
# rounds (and health checks) of a steady deployment; a replica that dies meanwhile costs no
# request: the balancer retries another at once (balancer.py)
STEADY_ROUND_S = 2.0


class HttpHealth:
    """``GET /healthz`` on a replica over a kept-alive connection: a new client per check
    builds an SSL context and a connection each time (it was 70% of an idle server's CPU)."""

    def __init__(self, timeout: float = 2.0):
        self._client = httpx.Client(timeout=timeout, limits=httpx.Limits(max_keepalive_connections=64))

    def __call__(self, url: str) -> bool:
        try:
            return self._client.get(url + "/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def close(self) -> None:
        self._client.close()


class DeploymentController:
    def __init__(self, sessions: sessionmaker[Session], balancer: Balancer, *, models_root: Path,
                 default_grace: float, max_body_bytes: int, health: Callable[[str], bool] | None = None,
                 clock: Callable[[], float] = time.monotonic, drain_seconds: float = 1.0,
                 leading: Callable[[], bool] = lambda: True, fence: Callable[[Session], None] = lambda s: None):
        self.sessions, self.balancer, self.models_root = sessions, balancer, models_root
        # a standby server (cluster/leader.py) routes predictions too, but only the leader
        # starts and stops replicas: ``leading`` says which this is, ``fence`` proves it in the
        # transaction that acts
        self.leading, self.fence = leading, fence
        self.default_grace, self.clock, self.drain_seconds = default_grace, clock, drain_seconds
        self.health = health or HttpHealth()
        self.max_body_bytes = max_body_bytes  # the balancer's limit (DEEPPOD_PREDICT_MAX_BYTES): replicas take the same
        self.wake = threading.Event()  # set when a deployment or a job is committed in this process
        self.failures: dict[int, int] = {}  # job id -> failed health checks in a row
        self.healthy_once: set[int] = set()
        self.unrouted_at: dict[int, float] = {}  # job id -> when it left the route

    def _healthy(self, job_id: int, state: str, endpoint: str | None) -> bool:
        if state != "running" or not endpoint:
            self.failures.pop(job_id, None)
            self.healthy_once.discard(job_id)
            return False
        if self.health(endpoint):
            self.failures[job_id] = 0
            self.healthy_once.add(job_id)
            return True
        self.failures[job_id] = self.failures.get(job_id, 0) + 1
        # a replica that answered before gets a few chances (it may be busy), a new one none
        return job_id in self.healthy_once and self.failures[job_id] < UNHEALTHY_AFTER

    def tick(self) -> str | None:
        with self.sessions() as s:
            snapshot = [(d.id, [(j.id, j.state, j.endpoint) for j in service.replicas(s, d)])
                        for d in s.scalars(select(Deployment))]
        if not snapshot:  # nothing to check, start or route: an idle server stays idle
            self.failures.clear()
            self.unrouted_at.clear()
            self.healthy_once.clear()
            self.balancer.set_routes([], {})
            return IDLE
        # health checks are HTTP calls: made between the two transactions, never inside one
        health = {job_id: self._healthy(job_id, state, endpoint)
                  for _, reps in snapshot for job_id, state, endpoint in reps}
        for table in (self.failures, self.unrouted_at):  # forget replicas that ended
            for job_id in [j for j in table if j not in health]:
                del table[job_id]
        self.healthy_once &= set(health)
        now = self.clock()
        routes = []
        act = self.leading()
        with self.sessions.begin() as s:
            fenced = []

            def prove_lead() -> None:  # before the round's first write only: a steady round writes nothing
                if not fenced:
                    self.fence(s)
                    fenced.append(True)

            for dep in s.scalars(select(Deployment)):
                routes.append(self._one(s, dep, health, now, act, prove_lead))
            keys = service.active_keys(s)
        self.balancer.set_routes(routes, keys)
        self.balancer.keep_history()
        # steady: nothing written, every replica healthy and routed; the next round (and health
        # check) comes in STEADY_ROUND_S, or at once when a deployment or a job changes here
        steady = not fenced and all(health.values()) and sum(len(r.targets) for r in routes) == len(health)
        return IDLE if steady else None

    def _one(self, s: Session, dep: Deployment, health: dict[int, bool], now: float, act: bool = True,
             prove_lead: Callable[[], None] = lambda: None) -> Route:
        reps = service.replicas(s, dep)
        views = []
        for j in reps:
            gone = self.unrouted_at.get(j.id)
            views.append(rollout.ReplicaView(
                job_id=j.id, version_id=j.model_version_id, healthy=health.get(j.id, False),
                inflight=self.balancer.load(j.id), unrouted_for=None if gone is None else now - gone))
        d = rollout.decide(rollout.DeploymentView(dep.id, dep.version_id, dep.replicas, service.failed_starts(s, dep)),
                           views, drain_seconds=self.drain_seconds)
        changes = act and (d.start or d.stop or (dep.state, dep.reason) != (d.state, d.reason))
        if changes:
            prove_lead()
        owner = service.owner(s, dep) if changes else None
        for _ in range(d.start if act else 0):
            job = service.start_replica(s, dep, models_root=self.models_root, default_grace=self.default_grace,
                                        max_body_bytes=self.max_body_bytes)
            log.info("deployment %s: started replica job %s", dep.name, job.id)
        for job_id in d.stop if act else ():
            job = s.get(Job, job_id)
            if job.state in ACTIVE_STATES and not job.cancel_requested:
                try:
                    jobs.cancel(s, owner, job_id)
                    log.info("deployment %s: stopping replica %s (drained)", dep.name, job_id)
                except DeepPodError as exc:
                    log.warning("deployment %s: could not stop replica %s: %s", dep.name, job_id, exc)
        route_ids = set(d.route)
        for v in views:  # when each replica left (or never joined) the route: what draining waits on
            if v.job_id in route_ids:
                self.unrouted_at.pop(v.job_id, None)
            else:
                self.unrouted_at.setdefault(v.job_id, now)
        if act and (dep.state, dep.reason) != (d.state, d.reason):
            dep.state, dep.reason = d.state, d.reason
        by_id = {j.id: j for j in reps}
        versions = {v.id: v.version for v in s.scalars(select(ModelVersion).where(
            ModelVersion.id.in_({j.model_version_id for j in reps} or {-1})))}
        model = s.get(Model, dep.model_id)
        targets = tuple(Target(i, by_id[i].endpoint, versions.get(by_id[i].model_version_id, 0),
                               (by_id[i].env or {}).get(ENV_REPLICA_SECRET, "")) for i in d.route)
        return Route(dep.id, dep.tenant_id, dep.name, model.name, targets, d.state)

    def run(self, stop: threading.Event, interval: float = 0.5) -> None:
        # a refused round: the next one only routes
        run_ticks(self.tick, stop, interval, "deployment", wake=self.wake, idle_interval=STEADY_ROUND_S)
