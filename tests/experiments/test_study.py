"""The study as the tune loop drives it: reports that reach it in one batch are pruned at the
step a trial in one process would have been pruned at."""

from deeppod.experiments.space import parse_space
from deeppod.experiments.study import Study, reopened_seed

SPACE = {"x": {"type": "float", "low": 0, "high": 1}}


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


def test_a_reopened_study_asks_for_new_parameters_and_stays_reproducible(tmp_path):
    """A restarted server reopens the study from its journal: a seeded sampler must not start its
    stream again (it asked for the first trials' parameters a second time), and the same
    history reopened gives the same next parameters."""
    def opened(folder):
        return Study(folder, mode="max", sampler="random", pruner="median", space=parse_space(SPACE), seed=7)

    def search(folder, before_restart):
        study = opened(folder)
        xs = [study.ask()[2]["x"] for _ in range(before_restart)]
        study = opened(folder)  # the server restarted
        return xs + [study.ask()[2]["x"] for _ in range(4)]

    first = search(tmp_path / "a", 4)
    assert len(set(first)) == 8, first  # nothing asked twice
    assert search(tmp_path / "b", 4) == first  # the same seed and history: the same search
    assert opened(tmp_path / "c").ask()[2]["x"] == first[0]  # a new search starts as before
    assert reopened_seed(None, 3) is None and reopened_seed(7, 0) == 7 and reopened_seed(7, 3) != reopened_seed(7, 4)
