"""One scheduling round of DeepPod's multi-tenant policy. Pure: snapshot in, decisions out.

The round is a pipeline of named phases (scheduler/phases/: health, candidates, reclaim,
fair_share, priority, least_attained, starts, grow), run in the order ``Config.phases`` gives,
each reading and changing the round's state (round_state.RoundState); making room for a
waiting job is preempt.py's.

Service classes need no run-time estimates: a job's class is how many of
``Config.las_thresholds`` (GPU-seconds) its attained service has passed, so short jobs
finish in class 0 while long ones sink, and a sunk job that has waited long enough
relative to what it has run is class 0 again (no starvation).
"""

from __future__ import annotations

from functools import cache

from deeppod.scheduler.phases import pipeline
from deeppod.scheduler.queue_order import effective_priority, queue_key, service_class, waiting_class
from deeppod.scheduler.round_cache import RoundCache
from deeppod.scheduler.round_state import RoundState, borrowing_jobs
from deeppod.scheduler.snapshot import Decisions, Snapshot

__all__ = ["borrowing_jobs", "effective_priority", "queue_key", "schedule", "service_class", "waiting_class"]

_pipeline = cache(pipeline)  # a configuration's phases are looked up once, not every round


def schedule(snap: Snapshot, cache: RoundCache | None = None) -> Decisions:
    """One round: the configuration's phases in its order. ``cache``: what the last round
    derived from the running jobs, brought up to date instead of walked again
    (round_cache.py); the decisions are the same with it or without."""
    st = RoundState.of(snap, cache)
    for _name, run, enabled in _pipeline(st.cfg.phases):
        if enabled is None or enabled(st):
            run(st)
    return st.out
