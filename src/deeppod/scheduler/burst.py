"""Bursting, pure: which waiting jobs go on burst nodes, and how many nodes of each burst type
to ask Ray's autoscaler for (IBM AI Infrastructure RA §5.7: add cloud nodes for the tenants
allowed to, give them back when idle).

The cluster's own round (policy.py) never sees burst nodes or the jobs on them: their GPUs
are not part of anyone's guarantee or share, and a job there is never a victim of reclaim or
preemption (it pays for its node). A job runs wholly on the own cluster or wholly on burst
nodes of one type. This round runs after the own round, on what it left waiting:

- a job of a tenant that may burst, waiting at least its type's ``wait_minutes``, while the
  own round makes no room for anyone (no preemption or shrink this round: reclaim and
  preemption come first), whose tenant's budgets are not spent, goes on free burst nodes of
  a type it may use, or, if none is free, new nodes of the first such type below its
  ``max_nodes`` are asked for (jobs asked for in one round share them);
- every type's ask is the nodes busy, idle for less than its ``idle_minutes``, and new:
  a node idle longer is left out, and the autoscaler lets it go.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from deeppod.scheduler.burst_types import BurstType
from deeppod.scheduler.pool import FreePool
from deeppod.scheduler.snapshot import Decisions, PendingJob, Snapshot, Start, Wait


@dataclass(frozen=True)
class BurstView:
    """What the controller knows beside the snapshot (its own memory and the store)."""

    spent: dict[str, float] = field(default_factory=dict)  # tenant -> spent on burst nodes so far
    idle_since: dict[str, float] = field(default_factory=dict)  # burst node -> when it last had no job
    short_since: dict[str, float] = field(default_factory=dict)  # type -> since when fewer nodes than asked are up
    notes: dict[str, str] = field(default_factory=dict)  # type -> what the autoscaler reports on adding its nodes


@dataclass(frozen=True)
class Ask:
    """Keep ``nodes`` nodes of burst type ``type`` (the autoscaler adds or lets go the difference)."""

    type: str
    nodes: int
    reason: str
    kept: tuple[str, ...] = ()  # the nodes up it counts (busy, or idle under idle_minutes); the others go


@dataclass
class BurstDecisions:
    starts: list[Start] = field(default_factory=list)
    waits: list[Wait] = field(default_factory=list)  # new reasons for jobs still waiting
    asks: dict[str, Ask] = field(default_factory=dict)
    wanted_by: dict[str, str] = field(default_factory=dict)  # type -> the tenant whose job asked for new nodes last


def split(snap: Snapshot) -> tuple[Snapshot, Snapshot]:
    """(the own cluster: no burst node and no job on one; the burst part: its nodes and jobs)."""
    burst = {n.name for n in snap.nodes if n.burst}
    if not burst:
        return snap, replace(snap, nodes=(), running=())
    on_burst = tuple(j for j in snap.running if any(w.node in burst for w in j.placement))
    own = replace(snap, nodes=tuple(n for n in snap.nodes if not n.burst),
                  running=tuple(j for j in snap.running if j not in on_burst))
    return own, replace(snap, nodes=tuple(n for n in snap.nodes if n.burst), running=on_burst)


def burst_round(part: Snapshot, own: Decisions, view: BurstView) -> BurstDecisions:
    """``part``: the burst part of the snapshot (``split``), with the whole queue; ``own``:
    what the own round decided."""
    types = {b.name: b for b in part.plan.burst}
    out = BurstDecisions()
    busy = {w.node for j in part.running for w in j.placement}
    up = [n for n in part.nodes if n.healthy and n.burst in types]
    waiting = {w.job_id: w for w in own.waits}
    started = {s.job_id for s in own.starts}
    # every job still queued, not only those the own round gave a reason: it reasons about the
    # head of each queue, and the jobs behind it need nodes as much
    queued = [j for j in part.queued if j.id not in started and j.gpus_per_worker > 0]
    making_room = bool(own.preempts or own.resizes)
    pools = {t: FreePool(tuple(n for n in up if n.burst == t)) for t in types}
    new: dict[str, list[list[float]]] = {t: [] for t in types}  # the nodes to add: each one's free room
    placed_on: set[str] = set()
    for job in sorted(queued, key=lambda j: (-j.priority, j.queued_at or j.submitted_at, j.id)):
        allowed = [b for b in part.plan.burst_types_for(job.tenant) if _fits(b, job)]
        if not allowed:
            continue
        # a budget spent, too short a wait, or room being made on the own cluster (perhaps for
        # this very job): no burst node, free or new, this round
        why = _over_budget(part, job, view) or _not_yet(part, job, allowed, making_room)
        if why:
            out.waits.append(Wait(job.id, _reason(waiting, job, why)))
            continue
        for b in allowed:  # free burst nodes first: they are paid for already
            got = pools[b.name].place(job.workers, job.gpus_per_worker, job.cpus_per_worker,
                                      job.memory_mb_per_worker, job.avoid, job.gpu_memory_mb)
            if got is not None:
                placed_on.update(w.node for w in got)
                out.starts.append(Start(job.id, got, f"on burst nodes of type {b.name} (tenant {job.tenant} may "
                                                     f"burst; the cluster's own GPUs are taken)"))
                break
        else:
            why, chosen = _ask_more(job, allowed, up, new, view, part.now)
            if chosen:
                out.wanted_by[chosen] = job.tenant
            out.waits.append(Wait(job.id, _reason(waiting, job, why)))
    for name, b in types.items():
        mine = [n for n in up if n.burst == name]
        kept = [n.name for n in mine if n.name in busy or n.name in placed_on
                or part.now - view.idle_since.get(n.name, part.now) < b.idle_minutes * 60]
        nodes = min(b.max_nodes, len(kept) + len(new[name]))
        parts = [f"{len(kept)} in use or idle under {b.idle_minutes:g} min"] if kept else []
        if new[name]:
            parts.append(f"{len(new[name])} more for waiting jobs")
        out.asks[name] = Ask(name, nodes, ", ".join(parts) or "no job needs one", tuple(sorted(kept)))
    return out


def _reason(waiting: dict[int, Wait], job: PendingJob, why: str) -> str:
    own = waiting[job.id].reason if job.id in waiting else "waiting behind its tenant's earlier jobs"
    return f"{own}; {why}"


def _holds(room: list[float], job: PendingJob) -> bool:
    return room[0] >= job.gpus_per_worker and room[1] >= job.cpus_per_worker and room[2] >= job.memory_mb_per_worker


def _fits(b: BurstType, job: PendingJob) -> bool:
    return (job.gpus_per_worker <= b.gpus and (not b.gpu_memory_mb or job.gpu_memory_mb <= b.gpu_memory_mb)
            and (not b.cpus or job.cpus_per_worker <= b.cpus)
            and (not b.memory_mb or job.memory_mb_per_worker <= b.memory_mb))


def _over_budget(part: Snapshot, job: PendingJob, view: BurstView) -> str:
    """Why ``job`` may not burst: a budget on its tenant's path is spent ('' if none is)."""
    for node, budget, members in part.plan.burst_budgets(job.tenant):
        spent = sum(view.spent.get(m, 0.0) for m in members)
        if spent >= budget:
            return f"the burst budget of {node!r} ({budget:g}) is spent ({spent:.2f}), so no burst node is asked for"
    return ""


def _not_yet(part: Snapshot, job: PendingJob, allowed: list[BurstType], making_room: bool) -> str:
    """Why no node is added for ``job`` yet ('' if one may be)."""
    waited = part.now - (job.queued_at or job.submitted_at)
    soonest = min(b.wait_minutes for b in allowed) * 60
    if soonest and waited < soonest:
        return f"it may burst after {soonest:g} s in the queue ({waited:.0f} s so far)"
    if making_room:
        return "the cluster is making room (preemption or shrinks this round), so it does not burst yet"
    return ""


def _ask_more(job: PendingJob, allowed: list[BurstType], up: list, new: dict[str, list[list[float]]],
              view: BurstView, now: float) -> tuple[str, str | None]:
    """Add the nodes ``job`` needs, of the first type it may use that has room, to ``new``
    (each new node's free GPUs, CPUs and memory: jobs asked for in one round share them):
    its wait reason, and that type (None if none has room)."""
    full = []
    for b in allowed:
        nodes = [list(n) for n in new[b.name]]
        before = len(nodes)
        for _ in range(job.workers):
            room = next((n for n in nodes if _holds(n, job)), None)
            if room is None:
                room = [float(b.gpus), float(b.cpus or math.inf), float(b.memory_mb or math.inf)]
                nodes.append(room)
            room[0] -= job.gpus_per_worker
            room[1] -= job.cpus_per_worker
            room[2] -= job.memory_mb_per_worker
        have = sum(1 for n in up if n.burst == b.name)
        if have + len(nodes) > b.max_nodes:
            full.append(f"{b.name} (at most {b.max_nodes} nodes)")
            continue
        new[b.name] = nodes
        need = len(nodes) - before
        why = (f"{need} burst node{'s' if need != 1 else ''} of type {b.name} asked of Ray's autoscaler" if need
               else f"a burst node of type {b.name} asked of Ray's autoscaler for an earlier job has room for it")
        since = view.short_since.get(b.name)
        if since is not None and now - since > b.start_minutes * 60:
            why += (f"; nodes asked for {now - since:.0f} s ago have not joined"
                    + (f" (the autoscaler says: {view.notes[b.name]})" if view.notes.get(b.name) else "")
                    + "; the autoscaler keeps trying")
        return why, b.name
    return f"no burst node to add: {', '.join(full)} already asked for", None
