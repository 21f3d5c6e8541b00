"""Applying and showing plans, on SQLite and PostgreSQL."""

import pytest

from deeppod.errors import Forbidden, InvalidRequest
from deeppod.plans.service import apply_plan, current_plan, plan_now, plan_status
from deeppod.scheduler.plan import parse_plan
from tests.fixtures import populate

GOOD = {"tenants": [{"name": "org", "guaranteed": 4, "max": 4, "children": [
    {"name": "a", "guaranteed": 2, "weight": 2}, {"name": "b", "guaranteed": 1, "lend_limit": 1}]}]}


def test_apply_and_read_back(sessions):
    world = populate(sessions)
    with sessions.begin() as s:
        apply_plan(s, world.admin, GOOD)
    with sessions() as s:
        plan, row = current_plan(s)
        assert row.applied_by == "admin" and plan.leaves() == ["a", "b"]
        rows = plan_status(s, world.admin)
        assert [(r.name, r.depth, r.guaranteed) for r in rows] == [("org", 0, 4), ("a", 1, 2), ("b", 1, 1)]
        # a user sees its tenant and the groups above it
        assert [r.name for r in plan_status(s, world.alice)] == ["org", "a"]


def test_the_plan_in_force_is_parsed_once_and_a_new_one_is_seen_at_once(sessions):
    world = populate(sessions)
    with sessions() as s:
        assert plan_now(s).leaves() == []  # none applied yet: the empty plan
    with sessions.begin() as s:
        apply_plan(s, world.admin, GOOD)
    with sessions() as s:
        first = plan_now(s)
        assert first.leaves() == ["a", "b"] and first == current_plan(s)[0]
    with sessions() as s:
        assert plan_now(s) is first  # the same version: not parsed again
    with sessions.begin() as s:
        apply_plan(s, world.admin, {"tenants": [{"name": "a", "guaranteed": 1}]})
    with sessions() as s:
        assert plan_now(s).leaves() == ["a"] and plan_now(s) == current_plan(s)[0]


BAD = [
    ({"tenants": [{"name": "a", "guaranteed": 5}]}, "cluster has 4"),
    ({"tenants": [{"name": "zzz", "guaranteed": 1}]}, "do not exist"),
    ({"tenants": [{"name": "a", "guaranteed": 2, "max": 1}]}, "below guaranteed"),
    ({"tenants": [{"name": "a", "guaranteed": 1, "lend_limit": 2}]}, "can only lend its own"),
    ({"tenants": [{"name": "a", "weight": 0}]}, "weight must be more than 0"),
    ({"tenants": [{"name": "a", "guaranted": 1}]}, "unknown field"),
    ({"tenants": [{"name": "a"}, {"name": "a"}]}, "appears twice"),
    ({"tenants": [{"name": "g", "guaranteed": 1, "children": [{"name": "a", "guaranteed": 2}]}]},
     "children are guaranteed"),
    ({"tenants": [{"name": "a", "guaranteed": 1.5}]}, "whole number"),
    ({"tenants": [{"name": "a", "guaranteed": -1}]}, "negative"),
    ({"tenant": []}, "a mapping with 'tenants'"),
    ({"tenants": "a"}, "must be a list"),
    ({"tenants": [], "surplus": "fifo"}, "'surplus' must be 'service'"),
]


@pytest.mark.parametrize("doc,message", BAD, ids=[m for _, m in BAD])
def test_bad_plans_are_refused_and_the_old_one_stays(sessions, doc, message):
    world = populate(sessions)
    with sessions.begin() as s:
        apply_plan(s, world.admin, {"tenants": [{"name": "a", "guaranteed": 1}]})
    with pytest.raises(InvalidRequest, match=message):
        with sessions.begin() as s:
            apply_plan(s, world.admin, doc)
    with sessions() as s:
        assert current_plan(s)[0].to_dict()["tenants"][0]["name"] == "a"


def test_only_admins_apply_plans(sessions):
    world = populate(sessions)
    with pytest.raises(Forbidden):
        with sessions.begin() as s:
            apply_plan(s, world.alice, GOOD)


def test_plan_round_trips():
    assert parse_plan(parse_plan(GOOD).to_dict()).to_dict() == parse_plan(GOOD).to_dict()


def test_surplus_order_defaults_to_service_and_round_trips():
    assert parse_plan(GOOD).surplus == "service" and "surplus" not in parse_plan(GOOD).to_dict()
    shared = parse_plan({**GOOD, "surplus": "share"})
    assert shared.surplus == "share" and parse_plan(shared.to_dict()) == shared
