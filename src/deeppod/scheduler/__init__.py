"""Pure scheduling policy: a snapshot in, decision values out. No DB, HTTP or processes."""

from deeppod.scheduler.plan import Plan, PlanNode, entitlements, parse_plan
from deeppod.scheduler.policy import schedule
from deeppod.scheduler.snapshot import (
                                        Config,
                                        Decisions,
                                        NodeState,
                                        PendingJob,
                                        Preempt,
                                        Resize,
                                        RunningJob,
                                        Snapshot,
                                        Start,
                                        Wait,
                                        WorkerPlacement,
)

__all__ = ["Config", "Decisions", "NodeState", "PendingJob", "Plan", "PlanNode", "Preempt", "Resize", "RunningJob",
           "Snapshot", "Start", "Wait", "WorkerPlacement", "entitlements", "parse_plan", "schedule"]
