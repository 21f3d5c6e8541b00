"""Whether a job can ever start as asked: its gang against the cluster's own nodes less what
is never preempted (deployment replicas, jobs marked not preemptible). A job that fails this
waits forever without an error; the submit answer warns (docs/scheduler.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Room:
    """A node as a job could have it: its size, and what work that is never preempted holds on it."""

    name: str
    gpus: int
    cpus: float
    memory_mb: int
    held_gpus: int = 0
    held_cpus: float = 0.0
    held_memory_mb: int = 0


@dataclass(frozen=True)
class Ask:
    workers: int  # the gang that must start together (an elastic job's minimum)
    gpus_per_worker: int = 0
    cpus_per_worker: float = 1.0
    memory_mb_per_worker: int = 0


def workers_fitting(room: Room, ask: Ask) -> int:
    """How many of ``ask``'s workers this node can ever hold at once."""
    limits = [int((room.cpus - room.held_cpus) // ask.cpus_per_worker) if ask.cpus_per_worker else None,
              (room.gpus - room.held_gpus) // ask.gpus_per_worker if ask.gpus_per_worker else None,
              (room.memory_mb - room.held_memory_mb) // ask.memory_mb_per_worker if ask.memory_mb_per_worker else None]
    known = [n for n in limits if n is not None]
    return max(0, min(known)) if known else ask.workers


def never_fits(ask: Ask, rooms: list[Room]) -> str | None:
    """None when ``ask`` can start once everything preemptible has made way; else why not, in
    the user's words, with what holds the room and what to change."""
    fitting = sum(workers_fitting(r, ask) for r in rooms)
    held = [r for r in rooms if r.held_gpus or r.held_cpus or r.held_memory_mb]
    if fitting >= ask.workers or not held:
        return None  # a job larger than the cluster itself is refused at submit, not warned of
    each = ", ".join(f"{n:g} {what}" for n, what in ((ask.gpus_per_worker, "GPUs"), (ask.cpus_per_worker, "CPUs"),
                                                    (ask.memory_mb_per_worker, "MB of memory")) if n)
    holds = "; ".join(f"{r.name}: " + ", ".join(f"{h:g} of {t:g} {what}" for h, t, what in (
        (r.held_gpus, r.gpus, "GPUs"), (r.held_cpus, r.cpus, "CPUs"), (r.held_memory_mb, r.memory_mb, "MB"))
        if h) for r in held)
    return (f"it can never start as asked: {ask.workers} workers x ({each}) must run at once, and beside what is "
            f"never preempted (deployment replicas, jobs that are not preemptible; {holds}) only "
            f"{fitting} such {'worker fits' if fitting == 1 else 'workers fit'}. Ask for fewer workers or less per "
            "worker, or free the room (scale a deployment down)")
