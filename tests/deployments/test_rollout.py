"""The rollout policy, one round at a time, with no processes or database."""

from deeppod.deployments.rollout import MAX_FAILED_STARTS, DeploymentView, ReplicaView, decide

V1, V2 = 11, 12


def rep(job, version, healthy=True, inflight=0, unrouted_for=None):
    return ReplicaView(job, version, healthy, inflight, unrouted_for)


def test_a_new_deployment_starts_its_replicas_and_routes_them_as_they_become_healthy():
    dep = DeploymentView(1, V1, replicas=2)
    d = decide(dep, [])
    assert d.start == 2 and d.route == [] and d.state == "deploying"
    d = decide(dep, [rep(1, V1), rep(2, V1, healthy=False)])
    assert d.start == 0 and d.route == [1] and d.state == "degraded"
    d = decide(dep, [rep(1, V1), rep(2, V1)])
    assert d.route == [1, 2] and d.state == "ready" and d.stop == []


def test_rolling_update_keeps_the_old_version_until_every_new_replica_is_healthy():
    dep = DeploymentView(1, V2, replicas=2)
    old = [rep(1, V1), rep(2, V1)]
    d = decide(dep, old)
    assert d.start == 2 and d.route == [1, 2] and d.state == "updating" and d.stop == []
    d = decide(dep, old + [rep(3, V2), rep(4, V2, healthy=False)])
    assert d.route == [1, 2] and d.stop == []  # one new one is not enough
    # all new healthy: traffic shifts; the old leave the route but are not stopped yet
    d = decide(dep, [rep(1, V1), rep(2, V1)] + [rep(3, V2), rep(4, V2)])
    assert d.route == [3, 4] and d.stop == []
    # out of the route, but still answering a request or not drained long enough: kept
    d = decide(dep, [rep(1, V1, inflight=1, unrouted_for=5), rep(2, V1, unrouted_for=0.2), rep(3, V2), rep(4, V2)])
    assert d.stop == []
    d = decide(dep, [rep(1, V1, unrouted_for=1.5), rep(2, V1, unrouted_for=1.5), rep(3, V2), rep(4, V2)])
    assert sorted(d.stop) == [1, 2] and d.route == [3, 4]
    d = decide(dep, [rep(3, V2), rep(4, V2)])
    assert d.state == "ready"


def test_a_version_that_keeps_failing_is_given_up_and_the_old_one_keeps_serving():
    dep = DeploymentView(1, V2, replicas=1, failed_starts=MAX_FAILED_STARTS)
    d = decide(dep, [rep(1, V1)])
    assert d.start == 0 and d.route == [1] and d.state == "failed" and "previous version keeps serving" in d.reason


def test_scaling_down_stops_the_extra_replicas_after_draining():
    dep = DeploymentView(1, V1, replicas=1)
    d = decide(dep, [rep(1, V1), rep(2, V1, unrouted_for=2)])
    assert d.route == [2] or d.route == [1]
    kept = d.route[0]
    other = 1 if kept == 2 else 2
    d = decide(dep, [rep(kept, V1), rep(other, V1, unrouted_for=2)])
    assert d.stop == [other]


def test_dead_old_replicas_are_stopped_at_once_and_a_lone_new_one_takes_traffic():
    dep = DeploymentView(1, V2, replicas=2)
    d = decide(dep, [rep(1, V1, healthy=False), rep(3, V2)])
    assert d.route == [3] and d.stop == [1]
