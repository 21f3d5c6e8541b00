"""Rollout policy: which replicas to start, route and stop for one deployment. Pure.

Rolling update, one round at a time: start the new version's replicas beside the old;
keep routing to the old until every new one is healthy; then route to the new only; an
old replica is stopped once it is out of the route, has nothing in flight, and has had
``drain_seconds`` for requests already on their way to land. Rollback is the same with
the versions swapped. A version whose replicas keep failing is not retried forever: the
old replicas keep serving and the deployment says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from deeppod.states import DeploymentState

MAX_FAILED_STARTS = 3  # replicas of one version that ended failed before we stop trying it


@dataclass(frozen=True)
class ReplicaView:
    job_id: int
    version_id: int
    healthy: bool  # running, announced, answering /healthz
    inflight: int  # requests the router has on it now
    unrouted_for: float | None  # seconds since it left the route (None: routed or never routed)


@dataclass(frozen=True)
class DeploymentView:
    id: int
    version_id: int  # the version it should serve
    replicas: int
    failed_starts: int = 0  # replicas of version_id that ended failed since it was asked for


@dataclass
class Decision:
    start: int = 0  # new replicas of version_id to submit
    stop: list[int] = field(default_factory=list)  # job ids to cancel now
    route: list[int] = field(default_factory=list)  # job ids that take traffic
    state: DeploymentState = DeploymentState.DEPLOYING
    reason: str = ""


def decide(dep: DeploymentView, replicas: list[ReplicaView], *, drain_seconds: float = 1.0) -> Decision:
    d = Decision()
    new = [r for r in replicas if r.version_id == dep.version_id]
    old = [r for r in replicas if r.version_id != dep.version_id]
    giving_up = dep.failed_starts >= MAX_FAILED_STARTS
    if len(new) < dep.replicas and not giving_up:
        d.start = dep.replicas - len(new)
    extra = sorted(new, key=lambda r: (r.healthy, r.job_id))[:max(0, len(new) - dep.replicas)]
    keep = [r for r in new if r not in extra]
    healthy_new = [r for r in keep if r.healthy]
    healthy_old = [r for r in old if r.healthy]
    switched = not healthy_old or len(healthy_new) >= dep.replicas  # all new healthy, or nothing else to route
    d.route = [r.job_id for r in (healthy_new if switched else healthy_old)]
    leaving = extra + (old if switched else [])
    for r in leaving:
        if r.job_id in d.route:
            continue
        if not r.healthy or (r.inflight == 0 and r.unrouted_for is not None and r.unrouted_for >= drain_seconds):
            d.stop.append(r.job_id)
    if giving_up and len(healthy_new) < dep.replicas:
        d.state = DeploymentState.FAILED
        d.reason = (f"{dep.failed_starts} replicas of the requested version failed to start; "
                    + ("the previous version keeps serving" if healthy_old else "nothing is serving")
                    + ": see 'deeppod logs JOB' of a replica, then update or roll back")
    elif old:
        d.state = DeploymentState.UPDATING
        d.reason = (f"{len(healthy_new)} of {dep.replicas} new replicas healthy; "
                    + ("draining the old ones" if switched else "the old version serves until all are"))
    elif len(healthy_new) >= dep.replicas:
        d.state, d.reason = DeploymentState.READY, f"{dep.replicas} replicas healthy"
    elif healthy_new:
        d.state, d.reason = DeploymentState.DEGRADED, f"{len(healthy_new)} of {dep.replicas} replicas healthy"
    else:
        d.state = DeploymentState.DEPLOYING
        d.reason = f"waiting for {dep.replicas} replicas to start and load the model"
    return d
