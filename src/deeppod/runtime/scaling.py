"""What happens to batch size and learning rate when a job resumes on M workers instead of N.

Two documented rules; the user picks one:

- ``keep_global_batch`` (default): the global batch stays what it was on the base world
  size; each worker's batch becomes ``ceil(global / M)`` and the learning rate is unchanged.
  Training follows the same trajectory, just at another speed.
- ``linear_lr``: each worker keeps its batch, so the global batch scales with M, and the
  learning rate scales with it: ``lr = base_lr * M / base_world_size`` (Goyal et al., 2017).
"""

from __future__ import annotations

import math

RULES = ("keep_global_batch", "linear_lr")


def scale_for_world(world_size: int, *, base_world_size: int, per_worker_batch: int, base_lr: float,
                    rule: str = "keep_global_batch") -> tuple[int, float]:
    """Per-worker batch and learning rate for ``world_size`` workers."""
    if rule not in RULES:
        raise ValueError(f"unknown scaling rule {rule!r}: use one of {', '.join(RULES)}")
    if world_size < 1 or base_world_size < 1 or per_worker_batch < 1:
        raise ValueError("world sizes and the batch must be at least 1")
    if rule == "keep_global_batch":
        return math.ceil(per_worker_batch * base_world_size / world_size), base_lr
    return per_worker_batch, base_lr * world_size / base_world_size
