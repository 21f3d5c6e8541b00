"""Bursting applied by the job controller, with the fake executor and a fake autoscaler, on
SQLite and PostgreSQL: what is asked of the autoscaler, where jobs start, what each tenant
is charged, and when burst nodes are let go."""

import time

import pytest
from sqlalchemy import select

from deeppod.cluster.burst import FakeAutoscaler, charges
from deeppod.cluster.gpus import LogicalProbe
from deeppod.cluster.inventory import NodeInfo
from deeppod.cluster.service import capacity, register_node, sync_nodes
from deeppod.executor.fake import FakeExecutor
from deeppod.jobs.controller import JobController
from deeppod.plans.burst_status import burst_status
from deeppod.plans.service import apply_plan, plan_status
from deeppod.store.models import Node
from tests.fixtures import Clock, load_job, populate, submit_job

CLOUD = {"name": "cloud", "gpus": 1, "max_nodes": 2, "cost_per_hour": 3600.0, "tenants": ["a"],
         "wait_minutes": 0, "idle_minutes": 1}


@pytest.fixture
def world(sessions):
    w = populate(sessions, gpus=1)
    with sessions.begin() as s:
        apply_plan(s, w.admin, {"tenants": [{"name": "a", "burst_budget": 500.0}, {"name": "b"}], "burst": [CLOUD]})
    return w


@pytest.fixture
def clock():
    c = Clock()
    c.t = time.time()  # nodes' join times are the store's wall clock
    return c


@pytest.fixture
def rec(sessions, tmp_path, clock):
    return JobController(sessions, FakeExecutor(), jobs_dir=tmp_path / "jobs", api_url="http://127.0.0.1:1",
                         clock=clock, autoscaler=FakeAutoscaler())


def _join(sessions, name="cloud-1"):
    with sessions.begin() as s:
        register_node(s, NodeInfo(name, "10.0.0.9", 8, 16384, tuple(LogicalProbe(1).probe()), burst="cloud"))


def _up(sessions, *names):
    """The inventory sees the own node and ``names`` up; other nodes went down."""
    with sessions() as s:
        own = [n for n in s.scalars(select(Node)) if n.burst is None]
    with sessions.begin() as s:
        infos = [NodeInfo(n.name, n.address, n.cpus, n.memory_mb, tuple(LogicalProbe(1).probe())) for n in own]
        sync_nodes(s, infos + [NodeInfo(n, "10.0.0.9", 8, 16384, tuple(LogicalProbe(1).probe()), burst="cloud")
                               for n in names])


def _charged(sessions) -> dict[str, float]:
    with sessions() as s:
        return {c.tenant: c.seconds for c in charges(s)}


def test_a_tenant_that_may_burst_gets_a_node_is_charged_and_lets_it_go(sessions, world, rec, tmp_path, clock):
    asked = rec.bursting.autoscaler.asked
    own = submit_job(sessions, world.bob, tmp_path, gpus_per_worker=1)
    rec.tick()
    assert load_job(sessions, own).state == "running" and not any(asked[-1:] and asked[-1].values())

    waiting_b = submit_job(sessions, world.bob, tmp_path, gpus_per_worker=1)
    bursting = submit_job(sessions, world.alice, tmp_path, gpus_per_worker=1)
    rec.tick()
    assert asked[-1] == {"deeppod-burst-cloud": 1}  # for a's job; b may not burst
    assert "1 burst node of type cloud asked of Ray's autoscaler" in load_job(sessions, bursting).reason
    assert "burst" not in load_job(sessions, waiting_b).reason

    _join(sessions)
    clock.t += 1
    rec.tick()
    j = load_job(sessions, bursting)
    assert j.state == "running" and j.placed_workers[0]["node"] == "cloud-1"
    assert load_job(sessions, waiting_b).state == "queued"  # a free burst node is still not b's
    with sessions() as s:
        assert capacity(s)["gpus"] == 1  # the own node's: nobody is guaranteed a burst node
        vision = {t.name: t for t in plan_status(s, world.admin)}["a"]
        assert vision.in_use == 0 and vision.borrowed == 0  # its burst GPU is outside the plan's arithmetic
    clock.t += 100
    rec.tick()
    assert _charged(sessions)["a"] == pytest.approx(101, abs=2)  # since it joined, at 1 a second

    rec.executor.finish(bursting, {0: 0})
    rec.tick()
    clock.t += 30
    rec.tick()
    assert asked[-1] == {"deeppod-burst-cloud": 1} and rec.bursting.autoscaler.kept == {"cloud-1"}
    clock.t += 31  # idle past idle_minutes: no longer asked for, and left alone
    rec.tick()
    assert asked[-1] == {"deeppod-burst-cloud": 0} and rec.bursting.autoscaler.kept == set()
    idle_charged = _charged(sessions)["a"]
    assert idle_charged == pytest.approx(162, abs=2)  # its idle minute is a's: it used the node last

    _up(sessions)  # the autoscaler removed it
    clock.t += 50
    rec.tick()
    assert _charged(sessions)["a"] == pytest.approx(idle_charged, abs=1e-6)  # nothing more once it is gone
    with sessions() as s:
        got = burst_status(s, world.admin, rec.bursting.asks)
        assert got.types[0]["nodes_up"] == 0 and got.types[0]["nodes_asked"] == 0
        assert got.charges == [{"tenant": "a", "node_type": "cloud", "nodes": 1, "seconds": pytest.approx(idle_charged),
                                "cost": pytest.approx(idle_charged)}]
        assert got.budgets == [{"tenant": "a", "budget": 500.0, "spent": pytest.approx(idle_charged, abs=1e-3)}]
        assert burst_status(s, world.bob, {}).charges == []  # another tenant's costs are not b's to see


def test_a_spent_budget_stops_new_nodes(sessions, world, rec, tmp_path, clock):
    with sessions.begin() as s:
        apply_plan(s, world.admin, {"tenants": [{"name": "a", "burst_budget": 50.0}, {"name": "b"}],
                                    "burst": [CLOUD]})
    submit_job(sessions, world.bob, tmp_path, gpus_per_worker=1)
    first = submit_job(sessions, world.alice, tmp_path, gpus_per_worker=1)
    rec.tick()
    _join(sessions)
    clock.t += 1
    rec.tick()
    clock.t += 60  # 60 of the budget's 50 spent
    rec.tick()
    rec.executor.finish(first, {0: 0})
    rec.tick()
    later = submit_job(sessions, world.alice, tmp_path, gpus_per_worker=1)
    rec.tick()
    j = load_job(sessions, later)
    assert j.state == "queued" and "the burst budget of 'a' (50) is spent" in j.reason


def test_without_an_autoscaler_burst_nodes_are_still_never_the_own_round_s(sessions, world, tmp_path):
    rec = JobController(sessions, FakeExecutor(), jobs_dir=tmp_path / "jobs", api_url="http://127.0.0.1:1")
    _join(sessions)
    submit_job(sessions, world.bob, tmp_path, gpus_per_worker=1)
    b2 = submit_job(sessions, world.bob, tmp_path, gpus_per_worker=1)
    rec.tick()
    assert load_job(sessions, b2).state == "queued"
