import pytest

from deeppod.runtime.scaling import scale_for_world


def test_keep_global_batch():
    assert scale_for_world(1, base_world_size=2, per_worker_batch=32, base_lr=0.1) == (64, 0.1)
    assert scale_for_world(4, base_world_size=2, per_worker_batch=32, base_lr=0.1) == (16, 0.1)
    assert scale_for_world(3, base_world_size=2, per_worker_batch=32, base_lr=0.1) == (22, 0.1)  # ceil


def test_linear_lr():
    assert scale_for_world(4, base_world_size=2, per_worker_batch=32, base_lr=0.1, rule="linear_lr") == (32, 0.2)


def test_bad_rule():
    with pytest.raises(ValueError, match="unknown scaling rule"):
        scale_for_world(1, base_world_size=1, per_worker_batch=1, base_lr=1, rule="magic")
