"""Entitlements: guarantees first, surplus by weight, caps, lend limits, nesting."""

import pytest

from deeppod.scheduler.plan import Plan, PlanNode, entitlements


def ent(plan_nodes, demand, cap):
    return entitlements(Plan(tuple(plan_nodes)), demand, cap)


def test_guarantee_up_to_demand_then_surplus_by_weight():
    e = ent([PlanNode("a", 4, weight=1), PlanNode("b", 4, weight=3)], {"a": 10, "b": 10}, 16)
    assert e["a"] == pytest.approx(6) and e["b"] == pytest.approx(10)


def test_idle_guarantee_is_lent_up_to_the_lend_limit():
    e = ent([PlanNode("a", 6, lend_limit=2), PlanNode("b", 2)], {"b": 8}, 8)
    assert e["b"] == pytest.approx(4) and e["a"] == 0


def test_max_caps_an_entitlement_and_the_rest_goes_to_others():
    e = ent([PlanNode("a", 0, max=2), PlanNode("b", 0)], {"a": 8, "b": 8}, 8)
    assert e["a"] == pytest.approx(2) and e["b"] == pytest.approx(6)


def test_nested_groups_share_inside_their_own_entitlement():
    org = PlanNode("org", 6, children=(PlanNode("x", 2, weight=1), PlanNode("y", 2, weight=1)))
    e = ent([org, PlanNode("z", 2)], {"x": 10, "y": 1, "z": 10}, 8)
    assert e["org"] == pytest.approx(6) and e["y"] == pytest.approx(1) and e["x"] == pytest.approx(5)
    assert e["z"] == pytest.approx(2)


def test_unplanned_tenants_share_what_is_unguaranteed():
    e = ent([PlanNode("a", 4)], {"a": 2, "new": 10}, 8)
    assert e["a"] == pytest.approx(2) and e["new"] == pytest.approx(6)
