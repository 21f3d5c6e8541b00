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


def step_per_tenant(amount: float, want: dict[str, float], weight: dict[str, float]) -> dict[str, float]:
    """The water-filling _water_fill replaced (2026-11-26): a step per tenant over every tenant."""
    got = {k: 0.0 for k in want}
    active = {k for k, w in want.items() if w > 1e-9}
    while amount > 1e-9 and active:
        total_w = sum(weight[k] for k in active)
        step = min((want[k] - got[k]) / weight[k] for k in active)
        give = min(step, amount / total_w)
        for k in list(active):
            got[k] += give * weight[k]
            if want[k] - got[k] <= 1e-9:
                active.discard(k)
        amount -= give * total_w
    return got


def test_water_filling_by_weight_gives_the_same_figures_as_a_step_per_tenant():
    """Bit for bit, with weights a plan may carry (halves, doubles), wants of whole GPUs and
    not: the entitlements, and every decision made on them, stay what they were."""
    import random

    from deeppod.scheduler.plan import _water_fill

    rng = random.Random(7)
    for _ in range(3000):
        want = {f"t{i}": rng.choice([0.0, rng.randint(0, 40), rng.uniform(0, 40)]) for i in range(rng.randint(1, 60))}
        weight = {k: rng.choice([1.0, 2.0, 0.5, 4.0, 1.5]) for k in want}
        amount = rng.choice([rng.uniform(0, 500), float(rng.randint(0, 500))])
        assert _water_fill(amount, want, weight) == step_per_tenant(amount, want, weight), (amount, want, weight)


def test_a_tenants_slurm_account_and_qos_are_its_own_or_the_nearest_above_it():
    from deeppod.errors import InvalidRequest
    from deeppod.scheduler.plan import parse_plan

    p = parse_plan({"tenants": [{"name": "lab", "slurm_account": "physics", "slurm_qos": "normal", "children": [
        {"name": "vision", "slurm_account": "phys-vision"}, {"name": "nlp"}]}, {"name": "ops"}]})
    assert [p.nearest(t, "slurm_account") for t in ("vision", "nlp", "ops")] == ["phys-vision", "physics", None]
    assert p.nearest("vision", "slurm_qos") == "normal"
    assert parse_plan(p.to_dict()) == p
    with pytest.raises(InvalidRequest, match="slurm_qos must be the name of a QOS of the Slurm cluster"):
        parse_plan({"tenants": [{"name": "a", "slurm_qos": "high; rm -rf"}]})
