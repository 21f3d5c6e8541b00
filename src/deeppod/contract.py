"""What the control plane, the CLI, the SDK and code inside jobs agree on.

Standard library only: user jobs, the per-job supervisor and the CLI import it.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    """A job's lifecycle::

        queued -> running -> succeeded | failed | cancelled | stopped
                  running -> preempted -> queued    (its GPUs went to another job)
                  running -> resizing  -> queued    (restarts with another worker count)

    ``preempted`` and ``resizing`` hold their resources until the workers have stopped.
    A ``stopped`` job was stopped gracefully on request and can be resumed.
    """

    QUEUED = "queued"
    RUNNING = "running"
    PREEMPTED = "preempted"
    RESIZING = "resizing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STOPPED = "stopped"

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATES

    @property
    def holds_resources(self) -> bool:
        return self in HOLDING_STATES


HOLDING_STATES = frozenset({JobState.RUNNING, JobState.PREEMPTED, JobState.RESIZING})
ACTIVE_STATES = HOLDING_STATES | {JobState.QUEUED}
FINAL_STATES = frozenset(JobState) - ACTIVE_STATES
