"""Bursting, pure: the own round never sees burst nodes; the burst round places waiting jobs of
tenants that may burst on burst nodes, asks for more, and lets idle ones go. One round at a
time, no processes or DB."""

from dataclasses import replace

import pytest

from deeppod.errors import InvalidRequest
from deeppod.scheduler import NodeState, parse_plan, schedule
from deeppod.scheduler.burst import BurstView, burst_round, split
from tests.scheduler.test_policy import job, node, running, snap

PLAN = {"tenants": [{"name": "vision", "guaranteed": 1, "burst_budget": 10.0},
                    {"name": "nlp", "guaranteed": 1}],
        "burst": [{"name": "cloud", "gpus": 2, "max_nodes": 2, "cost_per_hour": 4.0, "tenants": ["vision"],
                   "idle_minutes": 2, "wait_minutes": 1}]}


def burst_node(name, gpus=2, used=()):
    return replace(node(name, gpus=gpus, used=used), burst="cloud")


def both(s, view=BurstView()):
    """The own round, then the burst round on what it left: (own decisions, burst decisions)."""
    own, part = split(s)
    d = schedule(own)
    return d, burst_round(part, d, view)


def test_plan_burst_types_parse_and_round_trip():
    plan = parse_plan(PLAN)
    (cloud,) = plan.burst
    assert (cloud.gpus, cloud.max_nodes, cloud.cost_per_hour, cloud.resource) == (2, 2, 4.0, "deeppod-burst-cloud")
    assert [b.name for b in plan.burst_types_for("vision")] == ["cloud"]
    assert plan.burst_types_for("nlp") == []
    assert plan.burst_budgets("vision") == [("vision", 10.0, ["vision"])]
    assert parse_plan(plan.to_dict()) == plan


def test_a_group_named_in_a_burst_type_lets_its_sub_tenants_burst():
    plan = parse_plan({"tenants": [{"name": "lab", "burst_budget": 5, "children": [{"name": "vision"}]}],
                       "burst": [{"name": "cloud", "gpus": 1, "max_nodes": 1, "cost_per_hour": 1,
                                  "tenants": ["lab"]}]})
    assert [b.name for b in plan.burst_types_for("vision")] == ["cloud"]
    assert plan.burst_budgets("vision") == [("lab", 5.0, ["lab", "vision"])]


@pytest.mark.parametrize("burst, says", [
    ([{"name": "cloud", "gpus": 1, "max_nodes": 1, "cost_per_hour": 1, "tenants": ["nobody"]}], "not in the plan"),
    ([{"name": "cloud", "gpus": 0, "max_nodes": 1, "cost_per_hour": 1, "tenants": ["vision"]}], "more than 0"),
    ([{"name": "cloud", "gpus": 1, "cost_per_hour": 1, "tenants": ["vision"]}], "'max_nodes' is required"),
    ([{"name": "Cloud!", "gpus": 1, "max_nodes": 1, "cost_per_hour": 1, "tenants": ["vision"]}], "not valid"),
    ([{"name": "cloud", "gpus": 1, "max_nodes": 1, "cost_per_hour": -1, "tenants": ["vision"]}], "at least 0"),
    ([{"name": "cloud", "gpus": 1, "max_nodes": 1, "cost_per_hour": 1, "tenants": ["vision"], "zone": "x"}],
     "unknown field"),
    ({"name": "cloud"}, "must be a list"),
])
def test_bad_burst_types_say_what_to_fix(burst, says):
    with pytest.raises(InvalidRequest, match=says):
        parse_plan({"tenants": [{"name": "vision"}], "burst": burst})


def test_the_own_round_never_sees_burst_nodes_or_their_jobs():
    plan = parse_plan(PLAN)
    s = snap([node("own", gpus=1, used=(0,)), burst_node("b1", used=(0,))],
             [job(1, "nlp")], [running(7, "vision", [[0]], node="b1")], plan_=plan)
    own, part = split(s)
    assert [n.name for n in own.nodes] == ["own"] and own.running == ()
    assert [n.name for n in part.nodes] == ["b1"] and [j.id for j in part.running] == [7]
    d = schedule(own)
    assert not d.starts and not d.preempts  # the job on b1 is nobody's victim, and b1's free GPU not nlp's


def test_a_tenant_that_may_not_burst_is_never_placed_on_a_burst_node():
    s = snap([node("own", gpus=1, used=(0,)), burst_node("b1")], [job(1, "nlp", t=0.0)],
             [running(9, "vision", [[0]], node="own")], plan_=parse_plan(PLAN), now=1000.0)
    d, b = both(s, BurstView(idle_since={"b1": 0.0}))
    assert not d.starts and not b.starts
    assert b.asks["cloud"].nodes == 0  # and nothing is asked for it: b1, idle for long, goes


def test_a_waiting_job_goes_on_a_free_burst_node_before_more_are_asked_for():
    s = snap([node("own", gpus=1, used=(0,)), burst_node("b1")], [job(1, "vision", t=995.0)],
             [running(9, "nlp", [[0]], node="own")], plan_=parse_plan(PLAN), now=1000.0)
    _, b = both(s, BurstView(idle_since={"b1": 990.0}))
    assert not b.starts and "it may burst after 60 s in the queue (5 s so far)" in b.waits[0].reason
    s = replace(s, now=1056.0)
    _, b = both(s, BurstView(idle_since={"b1": 990.0}))
    (start,) = b.starts
    assert start.job_id == 1 and start.placement[0].node == "b1" and "burst nodes of type cloud" in start.reason
    assert b.asks["cloud"].nodes == 1  # the node it runs on is kept


def test_nodes_are_asked_for_after_the_wait_and_not_while_room_is_made():
    plan = parse_plan(PLAN)
    s = snap([node("own", gpus=1, used=(0,))], [job(1, "vision", workers=3, t=980.0)],
             [running(9, "nlp", [[0]], node="own", started=0.0)], plan_=plan, now=1000.0)
    _, b = both(s)
    assert b.asks["cloud"].nodes == 0 and "after 60 s in the queue (20 s so far)" in b.waits[0].reason
    _, b = both(replace(s, now=1050.0))
    assert b.asks["cloud"].nodes == 2  # 3 workers of 1 GPU on 2-GPU nodes
    assert "2 burst nodes of type cloud asked of Ray's autoscaler" in b.waits[0].reason
    assert b.wanted_by == {"cloud": "vision"}


def test_reclaim_comes_first():
    """vision is below its guarantee and nlp borrows: the own round preempts, nothing is asked
    and a free burst node is not taken (the room being made may be for this job)."""
    plan = parse_plan(PLAN)
    s = snap([node("own", gpus=2, used=(0, 1)), burst_node("b1")], [job(1, "vision", t=0.0)],
             [running(9, "nlp", [[0], [1]], node="own", started=0.0, min_workers=2)], plan_=plan, now=5000.0)
    d, b = both(s, BurstView(idle_since={"b1": 0.0}))
    assert d.preempts
    assert b.asks["cloud"].nodes == 0 and not b.starts
    assert "the cluster is making room" in b.waits[0].reason


def test_max_nodes_and_the_budget_cap_the_asks():
    plan = parse_plan(PLAN)
    s = snap([node("own", gpus=1, used=(0,))], [job(1, "vision", workers=5, t=0.0)],
             [running(9, "nlp", [[0]], node="own")], plan_=plan, now=1000.0)
    _, b = both(s)
    assert b.asks["cloud"].nodes == 0 and "cloud (at most 2 nodes)" in b.waits[0].reason
    s = replace(s, queued=(job(1, "vision", t=0.0),))
    _, b = both(s, BurstView(spent={"vision": 10.5}))
    assert b.asks["cloud"].nodes == 0 and "burst budget of 'vision' (10) is spent (10.50)" in b.waits[0].reason


def test_idle_nodes_are_kept_for_idle_minutes_then_let_go():
    s = snap([node("own", gpus=1), burst_node("b1"), burst_node("b2", used=(0,))], (),
             [running(5, "vision", [[0]], node="b2")], plan_=parse_plan(PLAN), now=1000.0)
    _, b = both(s, BurstView(idle_since={"b1": 900.0}))
    assert b.asks["cloud"].nodes == 2  # b1 idle 100 s < 120 s, b2 busy
    _, b = both(s, BurstView(idle_since={"b1": 800.0}))
    assert b.asks["cloud"].nodes == 1  # b1 idle 200 s: left out, the autoscaler lets it go


def test_nodes_that_do_not_join_are_reported_with_what_the_autoscaler_says():
    plan = parse_plan(PLAN)
    s = snap([node("own", gpus=1, used=(0,))], [job(1, "vision", t=0.0)],
             [running(9, "nlp", [[0]], node="own")], plan_=plan, now=2000.0)
    _, b = both(s, BurstView(short_since={"cloud": 1000.0}, notes={"cloud": "InstanceLimitExceeded: quota"}))
    why = b.waits[0].reason
    assert "asked for 1000 s ago have not joined (the autoscaler says: InstanceLimitExceeded: quota)" in why
    assert b.asks["cloud"].nodes == 1  # still asked for: the autoscaler retries


def test_jobs_behind_a_queue_s_head_get_nodes_in_the_same_round():
    s = snap([node("own", gpus=1, used=(0,))], [job(1, "vision", t=0.0), job(2, "vision", t=1.0)],
             [running(9, "nlp", [[0]], node="own")], plan_=parse_plan(PLAN), now=1000.0)
    _, b = both(s)
    assert b.asks["cloud"].nodes == 1 and {w.job_id for w in b.waits} == {1, 2}  # both on one 2-GPU node
    assert "room for it" in b.waits[1].reason
    s = replace(s, queued=(*s.queued, job(3, "vision", t=2.0)))
    _, b = both(s)
    assert b.asks["cloud"].nodes == 2


def test_a_job_too_large_for_a_burst_node_is_left_to_the_own_cluster():
    s = snap([node("own", gpus=4, used=(0, 1, 2, 3))], [job(1, "vision", gpus=4, t=0.0)],
             [running(9, "nlp", [[0, 1, 2, 3]], node="own", gpw=4)], plan_=parse_plan(PLAN), now=1000.0)
    d, b = both(s)
    assert b.asks["cloud"].nodes == 0 and not b.waits  # its wait reason is the own round's
    assert d.waits[0].job_id == 1


def test_an_unhealthy_burst_node_gets_nothing():
    s = snap([node("own", gpus=1, used=(0,)), replace(burst_node("b1"), healthy=False)],
             [job(1, "vision", t=0.0)], [running(9, "nlp", [[0]], node="own")], plan_=parse_plan(PLAN), now=1000.0)
    _, b = both(s)
    assert not b.starts


def test_node_state_defaults_to_an_own_node():
    assert NodeState("n", (0,), 1.0, 0).burst is None
