"""The study as the tune loop drives it: reports that reach it in one batch are pruned at the
step a trial in one process would have been pruned at."""

from deeppod.experiments.space import parse_space
from deeppod.experiments.study import Study


def test_a_batch_of_reports_is_pruned_at_its_rung_not_at_its_last_step(tmp_path):
    study = Study(tmp_path, mode="max", sampler="random", pruner="asha",
                  space=parse_space({"x": {"type": "float", "low": 0, "high": 1}}), seed=1)
    _, first, _ = study.ask()
    assert study.report(first, [(step, 0.5) for step in range(9)]) is None  # the rungs' (1, 3) first values: 0.5
    _, second, _ = study.ask()
    # behind at the first rung (step 1), ahead by step 8: successive halving stops it at step 1
    late = [(0, 0.1), (1, 0.2)] + [(step, 0.9) for step in range(2, 9)]
    assert study.report(second, late) == (1, 0.2)
    assert sorted(study.study.trials[1].intermediate_values) == [0, 1]  # what came after is not the study's
    _, third, _ = study.ask()
    assert study.report(third, late, prune=False) is None  # reported, not judged
    assert len(study.study.trials[2].intermediate_values) == 9


def test_a_lock_left_by_a_killed_server_does_not_stall_the_restarted_one(tmp_path):
    """The journal's lock is held across each append's fsync; a server killed meanwhile leaves it.
    The restarted server takes it over after a few seconds, not Optuna's default 30."""
    import os
    import time

    from deeppod.experiments.study import JOURNAL, LOCK_GRACE_S

    space = parse_space({"x": {"type": "float", "low": 0, "high": 1}})
    Study(tmp_path, mode="max", sampler="random", pruner="median", space=space, seed=1).ask()
    lock = tmp_path / (JOURNAL + ".lock")
    os.symlink(tmp_path / JOURNAL, lock)  # as the killed writer left it
    began = time.monotonic()
    study = Study(tmp_path, mode="max", sampler="random", pruner="median", space=space, seed=1)
    number, _, _ = study.ask()
    assert number == 1 and not lock.exists()
    assert time.monotonic() - began < 30  # Optuna's default grace; LOCK_GRACE_S is what it takes
    assert LOCK_GRACE_S <= 10


def test_prune_after_moves_the_first_rung_and_no_trial_is_stopped_before_it(tmp_path):
    from deeppod.experiments.study import judged_steps

    assert judged_steps("asha", 3).startswith("3,9,27,81,") and judged_steps("asha").startswith("1,3,9,")
    assert judged_steps("hyperband", 2).startswith("2,6,18,")
    study = Study(tmp_path, mode="max", sampler="random", pruner="asha",
                  space=parse_space({"x": {"type": "float", "low": 0, "high": 1}}), seed=1, prune_after=3)
    _, first, _ = study.ask()
    assert study.report(first, [(step, 0.5) for step in range(4)]) is None
    _, second, _ = study.ask()
    # at chance for its first steps, then ahead: not judged before step 3, and ahead there
    slow_start = [(0, 0.1), (1, 0.1), (2, 0.1), (3, 0.9)]
    assert study.report(second, slow_start) is None
    _, third, _ = study.ask()
    assert study.report(third, [(0, 0.1), (1, 0.1), (2, 0.1), (3, 0.2)]) == (3, 0.2)  # behind at the first rung


def test_the_median_rule_waits_for_prune_after(tmp_path):
    study = Study(tmp_path, mode="max", sampler="random", pruner="median",
                  space=parse_space({"x": {"type": "float", "low": 0, "high": 1}}), seed=1, prune_after=2)
    for _ in range(4):  # its start-up trials
        number, trial, _ = study.ask()
        assert study.report(trial, [(step, 0.9) for step in range(3)]) is None
        study.tell(number, "complete", 0.9)
    _, low, _ = study.ask()
    assert study.report(low, [(0, 0.1), (1, 0.1), (2, 0.1)]) == (2, 0.1)  # judged from step 2 on only


def test_a_trial_that_went_on_unjudged_is_stopped_once_its_rung_shows_it_behind(tmp_path):
    """The first to reach a rung goes on for want of others there; once enough trials have
    reached that rung to show it is not among the best third, it stops before the next rung."""
    study = Study(tmp_path, mode="max", sampler="random", pruner="asha",
                  space=parse_space({"x": {"type": "float", "low": 0, "high": 1}}), seed=1, prune_after=3)
    _, chance, _ = study.ask()
    assert study.report(chance, [(step, 0.1) for step in range(5)]) is None  # first at rung 3: on it goes
    _, good, _ = study.ask()
    assert study.report(good, [(step, 0.8) for step in range(4)]) is None  # ahead at rung 3
    assert study.report(chance, [(5, 0.1)]) == (5, 0.1)  # now behind the best one of two at rung 3
    assert study.report(good, [(4, 0.8)]) is None
    _, other, _ = study.ask()
    assert study.report(other, [(step, 0.3) for step in range(4)]) == (3, 0.3)  # judged at the rung, as before
    assert study.report(good, [(5, 0.8)], prune=False) is None  # reported, not judged


def test_only_successive_halving_judges_again(tmp_path):
    space = parse_space({"x": {"type": "float", "low": 0, "high": 1}})
    for pruner in ("asha", "hyperband", "median", "none"):
        study = Study(tmp_path / pruner, mode="min", sampler="random", pruner=pruner, space=space, seed=1)
        _, first, _ = study.ask()
        assert study.report(first, [(0, 0.9), (1, 0.9)]) is None  # first at rung 1 (step 1)
        _, second, _ = study.ask()
        assert study.report(second, [(0, 0.1), (1, 0.1)]) is None
        again = study.report(first, [(2, 0.9)])  # behind at rung 1 now; its next rung is step 3
        assert again == ((2, 0.9) if pruner == "asha" else None), pruner
