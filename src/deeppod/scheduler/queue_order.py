"""The order of a tenant's queue: priority aged up to the queue's top, then least attained
service class (a class sinks as a job runs and is lifted back to 0 after a long enough
wait), then submit time. Read by the round (policy.py, round_state.py) and by the round
cache, which keeps each key until ``queue_key_until``."""

from __future__ import annotations

import math

from deeppod.scheduler.snapshot import Config, PendingJob


def effective_priority(job: PendingJob, now: float, aging_seconds: float) -> int:
    if aging_seconds <= 0:
        return job.priority
    return job.priority + int(max(0.0, now - job.submitted_at) // aging_seconds)


def service_class(attained: float, thresholds: tuple[float, ...]) -> int:
    """How many attained-service thresholds (GPU-seconds) a job has passed."""
    return sum(attained >= x for x in thresholds)


def waiting_class(job: PendingJob, now: float, cfg: Config) -> int:
    """A queued job's class; back to 0 once it has waited ``starve_factor`` times the
    wall time it has run (and at least ``starve_after``) since it was last queued."""
    c = service_class(job.attained, cfg.las_thresholds)
    if c:
        since, wait = _starving(job, cfg)
        if now - since >= wait:
            return 0
    return c


def _starving(job: PendingJob, cfg: Config) -> tuple[float, float]:
    """Since when a classed job waits, and how long it must wait to be class 0 again."""
    ran = job.attained / max(1, job.min_workers * job.gpus_per_worker)
    since = job.queued_at if job.queued_at is not None else job.submitted_at
    return since, max(cfg.starve_after, cfg.starve_factor * ran)


def queue_key(job: PendingJob, now: float, cfg: Config, top: int) -> tuple:
    """A tenant's queue order: priority aged up to ``top`` (the highest waiting), service
    class, submit time."""
    aged = min(effective_priority(job, now, cfg.aging_seconds), max(top, job.priority))
    return -aged, waiting_class(job, now, cfg), job.submitted_at, job.id


_MARGIN = 1e-3  # seconds: far above the rounding of a time, far below a round's spacing


def queue_key_until(job: PendingJob, now: float, cfg: Config) -> float:
    """A time before which ``queue_key(job, t, cfg, top)`` is the same as at ``now`` for the
    same ``top``: the next step of its aged priority, or the moment a sunk class is lifted
    back to 0 (a little before either, so that rounding cannot cross one)."""
    until = math.inf
    if cfg.aging_seconds > 0:
        steps = max(0.0, now - job.submitted_at) // cfg.aging_seconds
        until = job.submitted_at + (steps + 1) * cfg.aging_seconds
    if service_class(job.attained, cfg.las_thresholds):
        since, wait = _starving(job, cfg)
        lifted = since + wait
        if now < lifted:
            until = min(until, lifted)
    return until - _MARGIN


def queue_gpus(q) -> int:
    """The GPUs a tenant's waiting jobs ``q`` ask for at their largest (a tenant's demand)."""
    return sum((j.resize_to or j.top_workers) * j.gpus_per_worker for j in q)

