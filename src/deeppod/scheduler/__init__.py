"""Pure scheduling policy: a snapshot in, decision values out. No DB, HTTP or processes."""

from deeppod.scheduler.policy import schedule
from deeppod.scheduler.snapshot import NodeState, PendingJob, Snapshot, Start, WorkerPlacement

__all__ = ["NodeState", "PendingJob", "Snapshot", "Start", "WorkerPlacement", "schedule"]
