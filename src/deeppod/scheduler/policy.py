"""One scheduling round."""

from __future__ import annotations

from deeppod.scheduler.placement import place
from deeppod.scheduler.snapshot import Snapshot, Start


def queue_order(snapshot: Snapshot):
    """Priority first, then submit time, then id (stable)."""
    return sorted(snapshot.queued, key=lambda j: (-j.priority, j.submitted_at, j.id))


def schedule(snapshot: Snapshot) -> list[Start]:
    """Start queued jobs in queue order while their whole gang fits.

    The head of the queue is never overtaken: a job that does not fit stops the round,
    so a large job is not starved by a stream of small ones.
    """
    nodes = snapshot.nodes
    decisions: list[Start] = []
    for job in queue_order(snapshot):
        placed = place(job, nodes)
        if placed is None:
            break
        placement, nodes = placed
        decisions.append(Start(job.id, placement, reason="resources available"))
    return decisions
