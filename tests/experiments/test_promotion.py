"""Successive halving by promotion (--pruner asha-promote): the pure rule one decision at a
time, then a whole search through the tune and job controllers with processes that keep
their paused trials (the fake executor; SQLite and PostgreSQL)."""

import pytest
from sqlalchemy import select

from deeppod.errors import InvalidRequest
from deeppod.experiments import promotion, service
from deeppod.experiments.study import judged_steps
from deeppod.store.models import JobEvent
from tests.experiments.test_reuse import Process, ReuseHarness, hosts
from tests.experiments.test_reuse import drive as reuse_drive


def test_the_first_trials_at_a_rung_wait_for_two_more():
    first = promotion.judge({0: 0.9}, 0, 3, "max")
    assert not first.go and "when 3 have reached it" in first.reason and "paused at step 3" in first.reason
    assert not promotion.judge({0: 0.9, 1: 0.95}, 1, 3, "max").go
    third = promotion.judge({0: 0.9, 1: 0.95, 2: 0.1}, 2, 3, "max")
    assert not third.go and "3 of 3" in third.reason
    best = promotion.judge({0: 0.9, 1: 0.95, 2: 0.99}, 2, 3, "max")
    assert best.go and "1 of 3" in best.reason and "the best 1 go on" in best.reason
    assert promotion.judge({0: 0.9, 1: 0.95, 2: 0.1}, 2, 3, "min").go  # lower is better


def test_a_paused_trial_is_promoted_once_enough_worse_ones_arrive():
    at = {3: {0: 0.9, 1: 0.5}}
    assert promotion.promotable({0: 3, 1: 3}, at, "max") == []
    at[3][2] = 0.1  # a third, worse: the best of three goes on
    assert promotion.promotable({0: 3, 1: 3}, at, "max") == [0]
    at[3].update({3: 0.2, 4: 0.3, 5: 0.4})  # six: the best two
    assert promotion.promotable({0: 3, 1: 3}, at, "max") == [0, 1]
    # one that went on already is counted at its rung but is not paused there
    assert promotion.promotable({1: 3}, at, "max") == [1]
    # the highest rung first
    at[9] = {0: 0.95, 6: 0.7, 7: 0.6}
    assert promotion.promotable({0: 9, 1: 3}, at, "max") == [0, 1]
    # ties go to the earlier trial
    assert promotion.promotable({4: 3, 5: 3}, {3: {4: 0.5, 5: 0.5, 6: 0.1}}, "max") == [4]


def test_the_last_call_is_the_best_of_the_highest_rung():
    at = {3: {0: 0.9, 1: 0.8, 2: 0.99}, 9: {0: 0.91, 1: 0.95}}
    assert promotion.last_call({0: 9, 1: 9, 2: 3}, at, "max") == 1
    assert promotion.last_call({0: 9, 1: 9, 2: 3}, at, "min") == 0
    assert promotion.last_call({}, at, "max") is None


def test_promotion_uses_the_rungs_of_asha():
    assert judged_steps("asha-promote", 3).startswith("3,9,27,81")


@pytest.fixture
def h(sessions, tmp_path):
    return ReuseHarness(sessions, tmp_path)


def test_it_needs_processes_that_keep_trials(h):
    with pytest.raises(InvalidRequest, match="asha-promote pauses a trial.*add --reuse"):
        h.create(pruner="asha-promote")


class Keeper(Process):
    """A process that keeps a paused trial's progress and goes on from it when handed back."""

    def __init__(self, h, job_id):
        super().__init__(h, job_id)
        self.paused: list[tuple[int, int]] = []  # (trial, step) at each pause
        self.steps: dict[int, list[int]] = {}  # every step each trial reported

    def run(self, answer, curve, steps):
        number = answer["number"]
        assert answer["turn"] == (0 if number not in self.kept else answer["turn"])
        start = self.kept.pop(number, 0)
        assert start == 0 or answer["turn"] > 0, "a trial handed back without a new turn"
        self.ran.append(number)
        for k in range(start, steps):
            self.report(number, k, curve(answer["params"], k))
            self.steps.setdefault(number, []).append(k)
            self.h.jobs.tick()
            self.h.tune.tick()
            with self.h.sessions() as s:
                state = service.trial_state(s, self.h.world.alice, self.job_id, number)
                told = service.stopping(s, self.job_id)
            assert (number in told["pausing"]) == (state == "pausing")
            if state == "pausing":
                self.kept[number] = k + 1
                self.paused.append((number, k))
                break
            if state == "pruning":
                self.pruned.append(number)
                break
        self.done = number


def drive(h, exp_id, curve, steps, rounds=600):
    return reuse_drive(h, exp_id, curve, steps, rounds, process=Keeper)


def by_x(params, step):
    return params["x"] * (step + 1) / 10


def test_a_search_pauses_at_rungs_and_promotes_the_best_third(h):
    exp_id = h.create(trials=12, parallel=2, reuse=True, pruner="asha-promote", prune_after=1, seed=3)
    procs = drive(h, exp_id, by_x, steps=10)
    exp = h.experiment(exp_id)
    assert exp.state == "completed", exp.reason
    rows = {t.number: t for t, _ in h.trials(exp_id)}
    assert len(rows) == 12 and not any(t.state in ("paused", "pausing", "running") for t in rows.values())
    steps = {n: s for p in procs.values() for n, s in p.steps.items()}
    # a promoted trial goes on from the step after its rung: every step once, in order
    assert all(s == list(range(len(s))) for s in steps.values()), steps
    # no trial ran past a rung on its own: the first ones waited there
    pauses = [pt for p in procs.values() for pt in p.paused]
    assert (0, 1) in pauses and (1, 1) in pauses
    # the best third of each rung went on: 12 reached step 1, 4 reached step 3, 1 ran to the end
    reached = {r: {n for n, s in steps.items() if r in s} for r in (1, 3, 9)}
    assert len(reached[1]) == 12 and len(reached[3]) == 4 and len(reached[9]) == 1, reached
    top = sorted(rows.values(), key=lambda t: -t.params["x"])
    assert reached[3] == {t.number for t in top[:4]} and reached[9] == {top[0].number}
    completed = [t for t in rows.values() if t.state == "completed"]
    assert [t.number for t in completed] == [top[0].number] and exp.best_trial == top[0].number
    pruned = [t for t in rows.values() if t.state == "pruned"]
    assert len(pruned) == 11 and all("among the best third" in t.reason for t in pruned), [t.reason for t in pruned]
    # most were pruned as soon as no trial still to come could lift them into their rung's best third
    assert sum("no longer able" in t.reason for t in pruned) >= 6
    # epochs run: 12 x 2 to the first rung, 4 x 2 more to the second, 1 x 6 to the end
    assert sum(len(s) for s in steps.values()) == 12 * 2 + 4 * 2 + 6
    # promoted trials went back to the process that kept them, and both processes exited
    assert not any(p.kept for p in procs.values())  # nothing left paused in a process
    assert all(h.fake.status[j.id].finished for j in hosts(h, exp_id))
    with h.sessions() as s:
        events = " ".join(s.scalars(select(JobEvent.message).where(JobEvent.job_id == rows[top[0].number].job_id)))
    assert "promoted at step" in events and "paused at step 1" in events


def test_a_search_whose_rungs_never_fill_still_completes_its_best(h):
    exp_id = h.create(trials=2, parallel=1, reuse=True, pruner="asha-promote", prune_after=1, seed=3)
    procs = drive(h, exp_id, by_x, steps=4)
    exp = h.experiment(exp_id)
    assert exp.state == "completed", exp.reason
    rows = {t.number: t for t, _ in h.trials(exp_id)}
    best = max(rows.values(), key=lambda t: t.params["x"])
    assert best.state == "completed" and exp.best_trial == best.number
    (p,) = procs.values()
    assert p.steps[best.number] == [0, 1, 2, 3]  # it waited at step 1, then went on to the end
    other = next(t for t in rows.values() if t.number != best.number)
    assert other.state == "pruned" and p.steps[other.number] == [0, 1]


def test_paused_trials_whose_process_ended_are_pruned(h):
    exp_id = h.create(trials=3, parallel=1, reuse=True, pruner="asha-promote", prune_after=1, seed=3)
    h.jobs.tick()
    h.tune.tick()
    (job,) = hosts(h, exp_id)
    p = Keeper(h, job.id)
    p.run(p.ask(), by_x, 4)
    assert p.paused == [(0, 1)]
    p.ask()  # it says trial 0 stopped there
    h.tune.tick()
    assert h.trials(exp_id)[0][0].state == "paused"
    h.fake.finish(job.id, {0: 1})  # the process dies with the state it kept
    for _ in range(5):
        h.jobs.tick()
        h.tune.tick()
    t = h.trials(exp_id)[0][0]
    assert t.state == "pruned" and "its process ended with its state" in t.reason
