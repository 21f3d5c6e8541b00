"""Champion/challenger: which of two evaluated versions wins. Pure."""

from __future__ import annotations

from dataclasses import dataclass


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
