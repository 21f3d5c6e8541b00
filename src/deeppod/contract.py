"""What the control plane, the CLI, the SDK and code inside jobs agree on.

Standard library only: user jobs, the per-job supervisor and the CLI import it.
"""

from __future__ import annotations

from enum import Enum


class JobState(str, Enum):
    """A job's lifecycle. ``preempted`` holds its GPUs until its workers have stopped."""

    QUEUED = "queued"
    RUNNING = "running"
    PREEMPTED = "preempted"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STOPPED = "stopped"  # gracefully, by request: resumable

    def __str__(self) -> str:
        return self.value

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATES


ACTIVE_STATES = frozenset({JobState.QUEUED, JobState.RUNNING, JobState.PREEMPTED})
FINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.STOPPED})
HOLDING_STATES = frozenset({JobState.RUNNING, JobState.PREEMPTED})  # their workers hold resources
