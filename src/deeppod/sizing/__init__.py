"""``deeppod size``: how many GPUs, nodes, CPU cores per GPU, storage throughput and capacity a
described workload needs, and why (docs/scheduler.md, "Sizing"). Pure arithmetic from the
workload and DeepPod's measured rates, plus the scheduler's own simulator replaying the
described job stream at candidate sizes for the queueing delay."""

from deeppod.sizing.model import Recommendation, Workload, size

__all__ = ["Recommendation", "Workload", "size"]
