"""Trace replay: the SAME policy code on a simulated clock, no processes.

A trace row is a job: arrival time, duration (the work at the requested GPU count),
GPUs, and the tenant (Philly's virtual cluster). Jobs of up to one node's GPUs run as
that many 1-GPU workers; larger ones as whole-node workers. An elastic job may run
with half to twice its workers; its speed scales linearly with its size. A preempted
job receives SIGTERM, checkpoints and stops ``stop_delay`` seconds later (holding its
GPUs until then), and pays ``restart_overhead`` seconds when it starts again; with
``checkpoint_interval`` set it also loses the work since its last periodic checkpoint
(the default assumes ``deeppod.runtime`` checkpoints on SIGTERM). An elastic job uses
``deeppod.runtime`` and resizes in place: it keeps running and pays ``resize_overhead``
seconds (leaving workers free their GPUs, new workers join from free GPUs); with
``in_place=False`` a resize is a stop and a restart at the new size, as before.
"""

from __future__ import annotations

import csv
import heapq
import math
import random
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter
from pathlib import Path

from deeppod.errors import InvalidRequest
from deeppod.scheduler.baselines import fifo, static
from deeppod.scheduler.plan import Plan, PlanNode
from deeppod.scheduler.policy import schedule
from deeppod.scheduler.round_cache import RoundCache
from deeppod.scheduler.snapshot import Config, Decisions, NodeState, PendingJob, Resize, RunningJob, Snapshot

POLICIES: dict[str, Callable[[Snapshot], Decisions]] = {"deeppod": schedule, "fifo": fifo, "static": static}


@dataclass(frozen=True)
class TraceJob:
    id: int
    tenant: str
    arrival: float  # seconds since the first arrival
    duration: float
    gpus: int


def load_trace(path: str | Path, limit: int | None = None, week: str | None = None) -> list[TraceJob]:
    """Jobs of a trace CSV; ``week`` ("2017-W41") keeps the jobs that arrived in that ISO week."""
    path = Path(path)
    if week is not None:
        try:
            year, wk = (int(x) for x in week.upper().split("-W"))
        except ValueError:
            raise InvalidRequest(f"week {week!r}: write it as YEAR-Wnn, e.g. 2017-W41") from None
    if not path.is_file():
        raise InvalidRequest(f"trace {path} does not exist")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        need = {"timestamp", "duration", "num_gpus", "cluster"}
        if not need <= set(reader.fieldnames or []):
            raise InvalidRequest(f"{path} needs the columns {', '.join(sorted(need))}; it has {reader.fieldnames}")
        rows = []
        for line, row in enumerate(reader, start=2):
            try:
                rows.append((datetime.fromisoformat(row["timestamp"]), float(row["duration"]), int(row["num_gpus"]),
                             row["cluster"]))
            except (ValueError, TypeError) as exc:
                raise InvalidRequest(f"{path}:{line}: cannot read this row ({exc})") from None
            if week is not None and tuple(rows[-1][0].isocalendar())[:2] != (year, wk):
                rows.pop()
            if limit and len(rows) >= limit:
                break
    if not rows:
        raise InvalidRequest(f"{path} holds no jobs" + (f" in week {week}" if week else ""))
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    return [TraceJob(i, c, (ts - t0).total_seconds(), max(1.0, d), max(1, g)) for i, (ts, d, g, c) in enumerate(rows)]


def scale_trace(trace: list[TraceJob], k: int, seed: int = 0, jitter: float = 300.0) -> list[TraceJob]:
    """The trace ``k`` times over, for a cluster ``k`` times the size: copy ``c`` of each
    tenant is a tenant of its own (``NAME~c``; copy 0 keeps the name) and each job's copy
    arrives up to ``jitter`` seconds either side of the original (never before the first
    arrival), so copies do not arrive in lockstep. Deterministic for a seed."""
    if k < 1:
        raise InvalidRequest(f"--scale {k}: give 1 or more (how many copies of the trace's tenants and jobs)")
    if k == 1:
        return list(trace)
    rng = random.Random(seed)
    rows = []
    for c in range(k):
        for j in trace:
            arrival = j.arrival if c == 0 else max(0.0, j.arrival + rng.uniform(-jitter, jitter))
            rows.append((arrival, j.tenant if c == 0 else f"{j.tenant}~{c}", j.duration, j.gpus))
    rows.sort(key=lambda r: r[0])
    return [TraceJob(i, t, a, d, g) for i, (a, t, d, g) in enumerate(rows)]


def proportional_plan(trace: list[TraceJob], total_gpus: int) -> Plan:
    """Each tenant is guaranteed its fair part: its share of the trace's GPU-time."""
    work: dict[str, float] = defaultdict(float)
    for j in trace:
        work[j.tenant] += j.duration * j.gpus
    total = sum(work.values())
    return Plan(tuple(PlanNode(t, guaranteed=int(total_gpus * w / total)) for t, w in sorted(work.items())))


@dataclass
class SimConfig:
    nodes: int = 64
    gpus_per_node: int = 8
    policy: str = "deeppod"
    elastic_fraction: float = 0.0
    seed: int = 0
    restart_overhead: float = 30.0
    stop_delay: float = 10.0
    checkpoint_interval: float | None = None
    in_place: bool = True  # elastic jobs resize in place (deeppod.runtime) instead of restarting
    resize_overhead: float = 5.0  # seconds an in-place resize costs the job
    round_cache: bool = True  # the policy keeps what it derived from the last round (round_cache.py)
    tick: float = 300.0  # a round at least this often while jobs wait (aging, reservations)
    sample_every: float = 900.0
    horizon: float = 60 * 86400.0  # stop after this much simulated time
    config: Config = field(default_factory=Config)


@dataclass
class _Job:
    t: TraceJob
    workers_req: int
    gpw: int
    min_w: int
    max_w: int
    work: float  # remaining, in seconds at the requested size
    state: str = "future"
    workers: int = 0
    placement: tuple = ()
    run_start: float = 0.0
    started: float = 0.0
    last_ckpt: float = 0.0
    version: int = 0
    first_start: float | None = None
    end: float | None = None
    restarts: int = 0
    resize_to: int | None = None
    within_guarantee: bool = False
    attained: float = 0.0  # GPU-seconds run in earlier runs (or before the last in-place resize)
    queued_at: float = 0.0
    # its snapshot rows, kept until what they say changes (a 10,000-GPU replay builds
    # thousands a round otherwise, and the round cache knows a job by its row)
    pending: PendingJob | None = None
    running: RunningJob | None = None


_PENDING, _RUNNING = attrgetter("pending"), attrgetter("running")


def _percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(math.ceil(q * len(xs))) - 1)]


class Simulator:
    def __init__(self, trace: list[TraceJob], plan: Plan, cfg: SimConfig):
        if cfg.policy not in POLICIES:
            raise InvalidRequest(f"unknown policy {cfg.policy!r}: use one of {', '.join(POLICIES)}")
        self.cfg, self.plan = cfg, plan
        self.policy = POLICIES[cfg.policy]
        self.cache = RoundCache() if cfg.policy == "deeppod" and cfg.round_cache else None
        rng = random.Random(cfg.seed)
        self.jobs: dict[int, _Job] = {}
        gpn = cfg.gpus_per_node
        for tj in trace:
            if tj.gpus > cfg.nodes * gpn:
                continue  # can never run on this cluster
            gpw = 1 if tj.gpus <= gpn else gpn
            workers = max(1, math.ceil(tj.gpus / gpw))
            elastic = cfg.policy == "deeppod" and rng.random() < cfg.elastic_fraction
            lo, hi = (max(1, workers // 2), min(workers * 2, cfg.nodes * gpn // gpw)) if elastic else (workers, workers)
            self.jobs[tj.id] = _Job(tj, workers, gpw, lo, hi, tj.duration)
        self.skipped = len(trace) - len(self.jobs)
        self.elastic = any(j.max_w > j.min_w for j in self.jobs.values())
        self.free = {f"n{i}": set(range(gpn)) for i in range(cfg.nodes)}
        self._node_rows: list[NodeState | None] = [None] * len(self.free)  # in node order
        self._node_at = {name: i for i, name in enumerate(self.free)}
        self._changed: set[str] = set(self.free)  # nodes whose free GPUs changed since the last snapshot
        self._stale_rows: list[_Job] = []  # jobs whose rows changed since the last snapshot
        self.g = {n.name: n.guaranteed for n, _, _ in plan.walk() if not n.children}
        self.usage: dict[str, int] = defaultdict(int)
        self.queued: dict[int, _Job] = {}
        # per tenant, how many of its queued jobs ask for each number of GPUs (_starved reads
        # the least of them every event: a walk of thousands of queued jobs otherwise)
        self._needs: dict[str, Counter] = defaultdict(Counter)
        self.running: dict[int, _Job] = {}
        self.events: list = []
        self.seq = 0
        self.round_ms: list[float] = []
        self.preemptions = self.resizes = self.in_place_resizes = 0
        self.lost_gpu_seconds = 0.0
        self.samples: list[tuple[float, dict[str, int]]] = []
        self.busy = self.busy_gpu_s = self.backlog_s = self.backlog_busy_gpu_s = 0.0
        self.starved_s: dict[str, float] = defaultdict(float)

    def _push(self, t: float, kind: str, job_id: int = -1, version: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, job_id, version))

    # -- bookkeeping ---------------------------------------------------------------
    def _rate(self, j: _Job) -> float:
        return j.workers / j.workers_req

    def _progress(self, j: _Job, now: float) -> float:
        return max(0.0, now - j.run_start) * self._rate(j)

    def _served(self, j: _Job, now: float) -> float:
        """GPU-seconds of the current run (its GPUs are held from the start, overhead included)."""
        return max(0.0, now - j.started) * j.workers * j.gpw

    @property
    def elastic_running(self) -> bool:
        return self.elastic and any(j.max_w > j.min_w for j in self.running.values())

    def _release(self, j: _Job) -> None:
        for w in j.placement:
            self.free[w.node].update(w.gpus)
            self._changed.add(w.node)
        self._stale(j)
        self.usage[j.t.tenant] -= j.workers * j.gpw
        self.busy -= j.workers * j.gpw
        j.placement = ()
        del self.running[j.t.id]

    def _starved(self) -> set[str]:
        """Tenants below their guarantee with a queued job that fits in it."""
        out = set()
        for t, needs in self._needs.items():
            g, used = self.g.get(t, 0), self.usage[t]
            if used < g and used + min(needs) <= g:
                out.add(t)
        return out

    def _enqueue(self, j: _Job) -> None:
        self.queued[j.t.id] = j
        self._needs[j.t.tenant][j.min_w * j.gpw] += 1

    def _dequeue(self, job_id: int) -> _Job:
        j = self.queued.pop(job_id)
        needs = self._needs[j.t.tenant]
        n = j.min_w * j.gpw
        needs[n] -= 1
        if not needs[n]:
            del needs[n]
            if not needs:
                del self._needs[j.t.tenant]
        return j

    def _stale(self, j: _Job) -> None:
        """``j``'s rows no longer say what it is: the next snapshot builds them again."""
        j.pending = j.running = None
        self._stale_rows.append(j)

    def _snapshot(self, now: float) -> Snapshot:
        gpn = self.cfg.gpus_per_node
        rows, at = self._node_rows, self._node_at
        for name in self._changed:
            rows[at[name]] = NodeState(name, tuple(sorted(self.free[name])), float(gpn), 1 << 30, True, gpn)
        self._changed.clear()
        for j in self._stale_rows:
            if j.t.id in self.queued and j.pending is None:
                j.pending = PendingJob(j.t.id, j.t.tenant, j.min_w, j.gpw, 0.0, 0, 0, j.t.arrival,
                                       max_workers=j.max_w if j.max_w > j.min_w else None, resize_to=j.resize_to,
                                       attained=j.attained, queued_at=j.queued_at)
            elif j.t.id in self.running and j.running is None:  # its service grows from j.started on
                j.running = RunningJob(j.t.id, j.t.tenant, j.placement, j.gpw, j.min_w, j.max_w, 0, True, j.started,
                                       j.last_ckpt, j.state == "stopping", attained=j.attained,
                                       in_place=self.cfg.in_place and j.max_w > j.min_w, attained_since=j.started)
        self._stale_rows.clear()
        return Snapshot(tuple(rows), tuple(map(_PENDING, self.queued.values())),
                        tuple(map(_RUNNING, self.running.values())), self.plan, now, self.cfg.config)

    def _resize_in_place(self, j: _Job, r, now: float) -> bool:
        """Shrink: the last workers leave and free their GPUs; grow: new workers join on
        ``r.added``. The job keeps its progress and pays ``resize_overhead``."""
        if r.workers > j.workers and (not r.added or any(not set(w.gpus) <= self.free[w.node] for w in r.added)):
            return False
        j.work = max(0.0, j.work - self._progress(j, now))
        j.attained += self._served(j, now)
        if r.workers < j.workers:
            for w in j.placement[r.workers:]:
                self.free[w.node].update(w.gpus)
                self._changed.add(w.node)
            j.placement = j.placement[:r.workers]
        else:
            for w in r.added:
                self.free[w.node].difference_update(w.gpus)
                self._changed.add(w.node)
            j.placement = j.placement + tuple(r.added)
        self._stale(j)
        delta = (r.workers - j.workers) * j.gpw
        self.usage[j.t.tenant] += delta
        self.busy += delta
        j.workers = r.workers
        self.lost_gpu_seconds += self.cfg.resize_overhead * j.workers * j.gpw
        j.started = now
        j.run_start = j.last_ckpt = now + self.cfg.resize_overhead
        j.version += 1
        self.resizes += 1
        self.in_place_resizes += 1
        self._push(j.run_start + j.work / self._rate(j), "done", j.t.id, j.version)
        return True

    def _apply(self, d: Decisions, now: float) -> None:
        for p in list(d.preempts) + list(d.resizes):
            j = self.running[p.job_id]
            if j.state == "stopping":
                continue
            resize = isinstance(p, Resize)
            if resize and p.in_place and self.cfg.in_place and self._resize_in_place(j, p, now):
                continue
            done = self._progress(j, now)
            if self.cfg.checkpoint_interval:
                ran = max(0.0, now - j.run_start)
                lost = ran % self.cfg.checkpoint_interval
                done = max(0.0, ran - lost) * self._rate(j)
                self.lost_gpu_seconds += lost * j.workers * j.gpw
            j.work = max(0.0, j.work - done)
            j.attained += self._served(j, now)
            j.started = now  # counted: the stop delay is not service
            j.state = "stopping"
            self._stale(j)
            j.version += 1
            if resize:
                j.resize_to = p.workers
                self.resizes += 1
            else:
                j.resize_to = None
                self.preemptions += 1
            self._push(now + self.cfg.stop_delay, "stopped", j.t.id, j.version)
        for s in d.starts:
            j = self._dequeue(s.job_id)
            for w in s.placement:
                self.free[w.node].difference_update(w.gpus)
                self._changed.add(w.node)
            j.placement, j.workers, j.state = s.placement, len(s.placement), "running"
            self._stale(j)
            j.resize_to = None
            overhead = self.cfg.restart_overhead if j.first_start is not None else 0.0
            self.lost_gpu_seconds += overhead * j.workers * j.gpw
            if j.first_start is None:
                j.first_start = now
            j.started = now
            j.run_start = j.last_ckpt = now + overhead
            j.version += 1
            self.running[j.t.id] = j
            self.usage[j.t.tenant] += j.workers * j.gpw
            self.busy += j.workers * j.gpw
            self._push(j.run_start + j.work / self._rate(j), "done", j.t.id, j.version)

    # -- the run ---------------------------------------------------------------------
    def run(self) -> dict:
        began = time.perf_counter()
        for j in self.jobs.values():
            self._push(j.t.arrival, "arrive", j.t.id)
        last_t, next_sample, tick_pending = 0.0, 0.0, False
        while self.events:
            now = self.events[0][0]
            if now > self.cfg.horizon:
                break
            dt = now - last_t
            if dt > 0:
                self.busy_gpu_s += self.busy * dt
                if self.queued:
                    self.backlog_s += dt
                    self.backlog_busy_gpu_s += self.busy * dt
                for t in self._starved():
                    self.starved_s[t] += dt
                while next_sample <= now:
                    self.samples.append((next_sample, {t: u for t, u in self.usage.items() if u}))
                    next_sample += self.cfg.sample_every
            last_t = now
            while self.events and self.events[0][0] == now:
                _, _, kind, jid, ver = heapq.heappop(self.events)
                j = self.jobs.get(jid)
                if kind == "arrive":
                    j.state, j.queued_at = "queued", now
                    self._stale(j)
                    self._enqueue(j)
                    need = j.min_w * j.gpw
                    j.within_guarantee = self.usage[j.t.tenant] + need <= self.g.get(j.t.tenant, 0)
                elif kind == "done" and ver == j.version and j.state == "running":
                    self._release(j)
                    j.state, j.end, j.work = "done", now, 0.0
                elif kind == "stopped" and ver == j.version:
                    self._release(j)
                    j.state, j.queued_at = "queued", now
                    self._stale(j)
                    j.restarts += 1
                    self._enqueue(j)
                elif kind == "tick":
                    tick_pending = False
            # as the control plane (jobs/controller.py): no round while nothing waits and no
            # elastic job runs (nodes are never sick here): the policy could decide nothing
            if self.queued or self.elastic_running:
                t0 = time.perf_counter()
                snap = self._snapshot(now)
                d = self.policy(snap, self.cache) if self.cache is not None else self.policy(snap)
                self.round_ms.append((time.perf_counter() - t0) * 1000)
                self._apply(d, now)
            if self.queued and not tick_pending:
                self._push(now + self.cfg.tick, "tick")
                tick_pending = True
        return self._report(last_t, time.perf_counter() - began)

    def _report(self, end: float, wall: float) -> dict:
        done = [j for j in self.jobs.values() if j.end is not None]
        jct = [j.end - j.t.arrival for j in done]
        wait = [j.first_start - j.t.arrival for j in self.jobs.values() if j.first_start is not None]
        reclaim = [j.first_start - j.t.arrival for j in self.jobs.values()
                   if j.within_guarantee and j.first_start is not None]
        capacity = self.cfg.nodes * self.cfg.gpus_per_node
        tenants = sorted({j.t.tenant for j in self.jobs.values()})
        return {
            "policy": self.cfg.policy,
            "cluster": {"nodes": self.cfg.nodes, "gpus_per_node": self.cfg.gpus_per_node, "gpus": capacity},
            "jobs": len(self.jobs), "completed": len(done), "skipped_too_large": self.skipped,
            "elastic_fraction": self.cfg.elastic_fraction,
            "simulated_hours": round(end / 3600, 2),
            "utilization": round(self.busy_gpu_s / (capacity * end), 4) if end else 0.0,
            "utilization_during_backlog": round(self.backlog_busy_gpu_s / (capacity * self.backlog_s), 4)
            if self.backlog_s else None,
            "backlog_hours": round(self.backlog_s / 3600, 2),
            "jct_avg_h": round(statistics.fmean(jct) / 3600, 3) if jct else None,
            "jct_p50_h": round(_percentile(jct, 0.5) / 3600, 3),
            "jct_p95_h": round(_percentile(jct, 0.95) / 3600, 3),
            "queue_delay_avg_h": round(statistics.fmean(wait) / 3600, 3) if wait else None,
            "queue_delay_p95_h": round(_percentile(wait, 0.95) / 3600, 3),
            "reclaim_latency_p95_s": round(_percentile(reclaim, 0.95), 1),
            "within_guarantee_jobs": len(reclaim),
            "preemptions": self.preemptions, "resizes": self.resizes, "in_place_resizes": self.in_place_resizes,
            "restart_gpu_hours_lost": round(self.lost_gpu_seconds / 3600, 1),
            "round_ms_avg": round(statistics.fmean(self.round_ms), 3) if self.round_ms else 0.0,
            "round_ms_p50": round(_percentile(self.round_ms, 0.5), 3),
            "round_ms_p95": round(_percentile(self.round_ms, 0.95), 3),
            "round_ms_p99": round(_percentile(self.round_ms, 0.99), 3),
            "round_ms_max": round(max(self.round_ms, default=0.0), 3),
            "rounds": len(self.round_ms),
            "wall_seconds": round(wall, 1),
            "starved_hours_by_tenant": {t: round(self.starved_s.get(t, 0.0) / 3600, 2) for t in tenants},
            "guarantee_by_tenant": {t: self.g.get(t, 0) for t in tenants},
            "share_samples": [{"t_h": round(t / 3600, 3), "usage": u} for t, u in self.samples],
        }


def plot_shares(results: list[dict], path: str | Path) -> Path | None:
    """Per-tenant GPUs in use over time against the guarantee, one panel per tenant."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    tenants = sorted(results[0]["guarantee_by_tenant"], key=lambda t: -results[0]["guarantee_by_tenant"][t])
    cols = 3
    rows = math.ceil(len(tenants) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 2.4 * rows), sharex=True, squeeze=False)
    week = 7 * 24
    for ax, t in zip(axes.flat, tenants):
        for r in results:
            xs = [s["t_h"] for s in r["share_samples"] if s["t_h"] <= week]
            ys = [s["usage"].get(t, 0) for s in r["share_samples"] if s["t_h"] <= week]
            ax.plot(xs, ys, label=r["policy"], linewidth=0.9)
        ax.axhline(results[0]["guarantee_by_tenant"][t], color="black", linestyle="--", linewidth=0.8,
                   label="guarantee")
        ax.set_title(f"tenant {t}", fontsize=9)
        ax.set_ylabel("GPUs", fontsize=8)
    for ax in list(axes.flat)[len(tenants):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("hours", fontsize=8)
    fig.suptitle("GPUs in use per tenant vs guarantee (Philly trace replay)", fontsize=11)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
