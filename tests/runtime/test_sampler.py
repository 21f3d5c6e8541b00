"""The elastic sampler finishes an interrupted epoch on any world size: every sample once."""

from hypothesis import given, settings
from hypothesis import strategies as st

from deeppod.runtime.sampler import ElasticSampler


def run_epoch_with_changes(n, batch, worlds_and_steps, seed=3):
    """Consume one epoch, changing the world size after the given numbers of steps.
    Returns the list of every sample consumed, in order."""
    seen = []
    state = None
    for world, steps in worlds_and_steps:
        samplers = [ElasticSampler(n, rank=r, world_size=world, seed=seed) for r in range(world)]
        for s in samplers:
            if state:
                s.load_state_dict(state)
        iters = [iter(s) for s in samplers]
        for _ in range(steps if steps is not None else 10**9):
            if samplers[0].epoch_done:
                break
            for it in iters:  # every worker takes one batch (the last ones may be short or empty)
                for _ in range(batch):
                    try:
                        seen.append(next(it))
                    except StopIteration:
                        break
            for s in samplers:
                s.advance(batch)
        state = samplers[0].state_dict()  # the checkpoint carries one number: the position
    return seen, state


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 300), batch=st.integers(1, 16),
       changes=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 6)), min_size=0, max_size=4),
       last=st.integers(1, 5))
def test_no_sample_twice_none_skipped_across_world_size_changes(n, batch, changes, last):
    seen, state = run_epoch_with_changes(n, batch, [*changes, (last, None)])
    assert sorted(seen) == list(range(n))
    assert state["position"] == n


def test_same_order_whatever_the_world_size():
    one, _ = run_epoch_with_changes(50, 5, [(1, None)])
    # 2 -> 3 workers: the set of samples is the same permutation, only dealt differently
    mixed, _ = run_epoch_with_changes(50, 5, [(2, 2), (3, None)])
    assert sorted(one) == sorted(mixed) == list(range(50))


def test_epochs_are_different_permutations_and_reproducible():
    s = ElasticSampler(100, rank=0, world_size=1, seed=1)
    e0 = list(s)
    s.set_epoch(1)
    e1 = list(s)
    assert e0 != e1 and sorted(e0) == sorted(e1)
    again = ElasticSampler(100, rank=0, world_size=1, seed=1)
    assert list(again) == e0


def test_len_matches_iteration_and_bad_state_is_refused():
    for world in (1, 2, 3, 7):
        for r in range(world):
            s = ElasticSampler(23, rank=r, world_size=world)
            s.position = 5
            assert len(s) == len(list(s))
    import pytest

    with pytest.raises(ValueError, match="covered 10 samples"):
        ElasticSampler(11).load_state_dict({"epoch": 0, "position": 3, "seed": 0, "n": 10})
