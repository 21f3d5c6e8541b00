"""Champion/challenger: which of two evaluated versions wins. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass

# metrics where less is better: losses, errors, distances, perplexity, time
_LOWER = re.compile(r"loss|err|mse|mae|rmse|perplexity|latency|seconds|time|wer|cer", re.IGNORECASE)
# where more is: scores of how good the model is. Anything else (a learning rate, an epoch, a
# training throughput) has no better side: it describes the run, not the model
_HIGHER = re.compile(r"acc|precision|recall|f1|auc|map|iou|dice|bleu|rouge|score|r2", re.IGNORECASE)


@dataclass(frozen=True)
class Figures:
    version: int
    dataset: str
    samples: int
    accuracy: float


def verdict(challenger: Figures, champion: Figures) -> tuple[bool, str]:
    """The challenger wins only with a strictly higher accuracy on the same data: a tie keeps
    the champion (nothing is gained by moving, and a move is a deployment change)."""
    if challenger.dataset != champion.dataset:
        raise ValueError("figures on different data cannot be compared")
    a, b = challenger.accuracy, champion.accuracy
    where = f"on {champion.dataset} ({champion.samples} images)"
    if a > b:
        return True, f"v{challenger.version} {a:.2%} beats champion v{champion.version} {b:.2%} {where}"
    if a == b:
        return False, f"v{challenger.version} ties champion v{champion.version} at {a:.2%} {where}"
    return False, f"v{challenger.version} {a:.2%} is below champion v{champion.version} {b:.2%} {where}"


def lower_is_better(metric: str) -> bool:
    return bool(_LOWER.search(metric))


def better_side(metric: str, a, b) -> str | None:
    """Which of two values of ``metric`` is better, "a" or "b" (each in its own direction:
    accuracy up, loss down); None for a tie, a value that is not a number, or a metric with no
    better side (lr, epoch, images_per_second)."""
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
    if not numbers or a == b or not (lower_is_better(metric) or _HIGHER.search(metric)):
        return None
    return "a" if (a < b) == lower_is_better(metric) else "b"
