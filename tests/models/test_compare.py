"""Which of two metric values is better, each metric in its own direction."""

import pytest

from deeppod.models.compare import better_side, lower_is_better


@pytest.mark.parametrize("metric, a, b, want", [
    ("val_accuracy", 0.9, 0.95, "b"), ("val_loss", 0.3, 0.2, "b"), ("loss", 0.1, 0.2, "a"),
    ("error_rate", 0.05, 0.07, "a"), ("top5_acc", 0.8, 0.7, "a"), ("f1", 0.5, 0.5, None),
    ("val_accuracy", None, 0.5, None), ("p99_latency_ms", 20.0, 30.0, "a"),
    # issue 71: these describe the run, not the model: no side is better
    ("lr", 0.1, 0.05, None), ("epoch", 3, 5, None), ("images_per_second", 900.0, 1200.0, None),
])
def test_better_side(metric, a, b, want):
    assert better_side(metric, a, b) == want


def test_directions():
    assert lower_is_better("val_loss") and lower_is_better("MSE") and not lower_is_better("val_accuracy")
