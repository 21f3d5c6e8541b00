"""The balancer's traffic totals and the history it keeps of them, on a fake clock."""

from deeppod.deployments.balancer import HISTORY_S, HISTORY_STEP_S, Balancer, Route, Target


class Clock:
    def __init__(self):
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _routed(clock: Clock) -> Balancer:
    b = Balancer(clock=clock)
    b.set_routes([Route(1, 1, "pets", "pets", (Target(7, "http://127.0.0.1:1", 1),))], {})
    return b


def test_totals_count_direct_predictions_and_their_errors():
    b = _routed(Clock())
    b.count_direct(1, [{"codes": {"200": 3, "500": 1}, "seconds": 0.4}])
    t = b.traffic(1)
    assert (t["requests"], t["direct"], t["errors"], t["latency_count"]) == (4, 4, 1, 4)
    assert t["latency_sum"] == 0.4


def test_history_keeps_a_point_every_step_for_ten_minutes_traffic_or_not():
    clock = Clock()
    b = _routed(clock)
    b.keep_history()  # the controller's round: the first point, at zero
    b.count_direct(1, [{"codes": {"200": 5}, "seconds": 0.5}])
    clock.now += HISTORY_STEP_S / 2
    b.keep_history()  # too soon: nothing kept
    assert [h["requests"] for h in b.traffic(1)["history"]] == [0]
    clock.now += HISTORY_STEP_S / 2
    b.keep_history()
    t = b.traffic(1)
    assert [(h["at"], h["requests"]) for h in t["history"]] == [(1_000.0, 0), (1_000.0 + HISTORY_STEP_S, 5)]
    assert t["at"] == clock.now and t["requests"] == 5
    for _ in range(int(HISTORY_S / HISTORY_STEP_S) + 5):  # no traffic: points all the same
        clock.now += HISTORY_STEP_S
        b.keep_history()
    history = b.traffic(1)["history"]
    assert clock.now - history[0]["at"] <= HISTORY_S and history[-1]["at"] == clock.now
    assert {h["requests"] for h in history} == {5}


def test_a_deployment_never_routed_has_no_history():
    b = Balancer(clock=Clock())
    b.keep_history()
    assert b.traffic(3)["history"] == [] and b.traffic(3)["requests"] == 0
