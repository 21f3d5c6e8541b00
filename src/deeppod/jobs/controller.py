"""The job controller, the scheduling loop: observe executors, apply cancels, ask the policy
(``deeppod.scheduler``), carry out its decisions. The scheduler decides (pure), the executor
acts; this module alone joins them with the store. Every tick is safe to repeat, so a restarted
server re-adopts jobs that kept running while it was down. Beside it: snapshot.py, runs.py (what
a run's end means), launch.py and resize.py (in place, with warm spares)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from deeppod.cluster.burst import Autoscaler, Bursting
from deeppod.cluster.service import NodeUsage, mark_down, usage_of
from deeppod.contract import HOLDING_STATES, JobState, base_environment, same_reason
from deeppod.executor.base import ExecStatus, Executor
from deeppod.jobs import time_limit
from deeppod.jobs.allocation import Allocation
from deeppod.jobs.launch import Isolation, Launcher
from deeppod.jobs.metrics import take_spool
from deeppod.jobs.progress import stop_outcome
from deeppod.jobs.resize import Resizes
from deeppod.jobs.runs import NOT_LAUNCHED, never_launched, outcome, requeue, run_mark
from deeppod.jobs.service import add_event, finish, move
from deeppod.jobs.snapshot import snapshot
from deeppod.jobs.starting import start_run
from deeppod.loops import IDLE, run_ticks
from deeppod.scheduler import Config, Snapshot, Start
from deeppod.store.models import Job, Node, utcnow

log = logging.getLogger(__name__)
MAX_RESUMES = 100  # a job that keeps asking to be resumed is stopped at some point


class JobController:
    def __init__(self, sessions: sessionmaker[Session], executor: Executor, *, jobs_dir: Path,
                 api_url: str, server_env: dict[str, str] | None = None, config: Config | None = None,
                 clock: Callable[[], float] = time.time, stage: Callable[[int], str] | None = None,
                 on_finished: Callable[[Session, Job], None] | None = None, isolation: Isolation | None = None,
                 ca_cert: str | None = None, fence: Callable[[Session], None] | None = None, spares: int = 0,
                 autoscaler: Autoscaler | None = None):
        self.sessions = sessions
        self.executor = executor
        # inside every deciding transaction: raises NotLeader unless this server leads
        # (cluster/leader.py); None: this server is the only one
        self.fence = fence or (lambda s: None)
        self.on_finished = on_finished  # called in the same transaction when a job ends for good
        self.config = config or Config()
        self.clock = clock
        self.launcher = Launcher(executor, jobs_dir=jobs_dir, api_url=api_url, stage=stage, isolation=isolation,
                                 base_env=base_environment(dict(os.environ if server_env is None else server_env)),
                                 ca_cert=ca_cert)
        self.resizes = Resizes(sessions, self.launcher, fence=self.fence, clock=clock, spares=spares)
        self.hurry = self.resizes.hurry  # set when a grow's workers are ready or a trial is added: the next round now
        self.wake = threading.Event()  # set when a job is submitted in this process (server.build)
        self.bursting = Bursting(autoscaler)  # the plan's burst nodes (none without an autoscaler)
        self.last_round_ms = 0.0
        self.rounds = 0  # rounds completed (a new leader's first one is its first decision)

    def job_dir(self, job_id: int) -> Path:
        return self.launcher.folder(job_id).root

    def tick(self) -> str | None:
        with self.sessions.begin() as s:  # two queries for a steady round: the jobs holding GPUs, and whether one waits
            holding = list(s.scalars(select(Job).where(Job.state.in_(HOLDING_STATES))))
            # not the queue's rows: a deep queue would be loaded (and its env unsealed) every round for nothing
            waiting = s.scalar(select(Job.id).where(Job.state == JobState.QUEUED).limit(1)) is not None
            bursting = self.bursting.active(s)  # burst nodes cost money while up: a round each tick
            if not holding and not waiting and not self.resizes.grows and not bursting:  # an idle server idles
                self.rounds += 1
                return IDLE
            # fences the transaction itself, once it has something to write
            changed = self.observe(s, holding)
            # being cancelled or preempted: SIGTERM (again, after a restart: idempotent)
            stopping = [j.handle for j in holding if j.handle is not None and j.stopping]
            elastic = any((j.max_workers or 0) > j.workers for j in holding)
        for handle in stopping:
            self.executor.terminate(handle)
        starts, stop_now = [], []
        if changed or self.resizes.grows or waiting or elastic or bursting or self._something_sick():
            with self.sessions.begin() as s:
                self.fence(s)
                starts, stop_now = self.decide(s)
        for handle in stop_now:
            self.executor.terminate(handle)
        self.bursting.send()  # after the commit: no transaction waits on the autoscaler
        self.resizes.start_grows()
        for start in starts:
            self.start(start)
        self.rounds += 1

    def _something_sick(self) -> bool:
        """Whether a node or GPU is sick (its jobs move). With that, a waiting job, an elastic one
        running (it may grow into GPUs that freed up) or burst nodes, the policy could decide
        something; otherwise the round skips the snapshot: a server running fixed jobs idles."""
        with self.sessions() as s:
            return any(not (n.up and n.healthy) or not all(g.get("healthy", True) for g in n.gpus)
                       for n in s.scalars(select(Node)))

    def observe(self, s: Session, holding: list[Job]) -> bool:
        """Poll the jobs holding GPUs; record those that ended. Whether it wrote anything."""
        fenced = False
        held: dict[str, NodeUsage] | None = None  # per node, computed once, when a spare count needs it
        for job in holding:
            handle = job.handle or self.executor.find(job.id, self.job_dir(job.id), run_mark(job))
            status = self.executor.poll(handle) if handle else NOT_LAUNCHED
            if (status.phase or None) != job.phase and not status.finished:  # shown: "preparing environment"
                before, job.phase = job.phase, status.phase or None
                if job.phase and not same_reason(before or "", job.phase):  # kept in its history, as a wait's reason
                    add_event(s, job, "phase", job.phase)
            alloc = Allocation.of(job)
            resizing = alloc.resize is not None
            spares = None if status.finished or resizing else 0
            if spares == 0 and self.resizes.may_keep_spares(job):
                held = usage_of(holding) if held is None else held
                spares = self.resizes.spares_for(s, job, held)
            respare = spares is not None and spares != alloc.spares
            # a cluster that queues (Slurm) was handed the limit and enforces it itself
            timed_out = not status.finished and not self.executor.queues and time_limit.over(job, self.clock())
            # a cluster that queues places its workers itself (Slurm): where, once it says
            moved = self.executor.queues and not status.finished and alloc.place(status.placed)
            writes = status.finished or resizing or respare or timed_out or moved
            if not fenced and writes:  # prove the lead first
                self.fence(s)
                fenced = True
            if handle is None:  # its server stopped after deciding to start it and before launching it
                never_launched(s, job)
            elif status.finished:
                self._ended(s, job, status)
            elif timed_out:
                time_limit.stop(s, job)
            elif resizing:
                self.resizes.follow(s, job, status)
            elif respare:
                self.resizes.keep_spares(job, handle, spares, held)
            if moved:
                alloc.save(job)
                add_event(s, job, "placed", "its cluster's scheduler placed it: " + ", ".join(
                    f"rank {w.rank} on {w.node}" + (f" (GPU {','.join(map(str, w.gpus))})" if w.gpus else "")
                    for w in alloc.workers))
        return fenced

    def _ended(self, s: Session, job: Job, status: ExecStatus) -> None:
        """A run ended: the job is done, or goes back to the queue (a restart, a resume)."""
        checkpoints = self.launcher.folder(job.id).checkpoints
        take_spool(s, job, checkpoints)  # points its processes could not send while the server was away
        asked = job.stop_requested_at.timestamp() if job.stop_requested_at else None
        state, reason = outcome(job, status, stop_outcome(checkpoints, asked))  # finish or requeue revokes its tokens
        if status.lost_nodes:
            mark_down(s, status.lost_nodes)
        if self.launcher.isolation is not None:  # its workers are gone: so is what they shared in memory
            self.launcher.remove_shm(job.id)
        pending = Allocation.of(job).resize
        if pending and state == JobState.FAILED:  # a worker failed during the switch: restart instead
            requeue(s, job, f"the in-place resize to {pending.to} workers failed ({reason}); it "
                            f"restarts from its checkpoint with {pending.to} workers", status)
        elif state == JobState.FAILED and job.restart_count < job.max_restarts:
            failed = {r for r, c in status.exit_codes.items() if c != 0} or {w["rank"] for w in job.placed_workers}
            job.avoid = [[w["node"], g] for w in job.placed_workers if w["rank"] in failed for g in w["gpus"]]
            requeue(s, job, f"{reason}; restart {job.restart_count + 1} of {job.max_restarts}, "
                            "avoiding the failed GPUs", status)
        elif state == JobState.QUEUED and job.restart_count < MAX_RESUMES:
            requeue(s, job, reason, status)
        elif state == JobState.QUEUED:
            finish(s, job, JobState.FAILED, f"{reason}, but it was restarted {job.restart_count} times already",
                   status.exit_codes)
        else:
            finish(s, job, state, reason, status.exit_codes)
            job.endpoint = None
            log.info("job %s %s: %s", job.id, state, reason)
            if self.on_finished is not None:
                try:
                    with s.begin_nested():
                        self.on_finished(s, job)
                except Exception:  # a hook must not undo the round's observations
                    log.exception("after job %s ended", job.id)

    def snapshot(self, s: Session) -> Snapshot:
        return snapshot(s, folder=self.launcher.folder, in_place=self.executor.in_place, config=self.config,
                        now=self.clock())

    def decide(self, s: Session) -> tuple[list[Start], list[dict]]:
        """Ask the policy; record every decision with its reason. Resources are taken in the
        store before any process starts; stops are sent after the commit."""
        snap = self.snapshot(s)
        began, d = time.perf_counter(), self.bursting.schedule(s, snap)  # the policy's, then the burst round
        self.last_round_ms, stop_now = (time.perf_counter() - began) * 1000, []
        for p in d.preempts:
            job = s.get(Job, p.job_id)
            if not move(s, job, JobState.PREEMPTED, p.reason, stop_requested_at=utcnow()):
                continue
            add_event(s, job, JobState.PREEMPTED, f"{p.reason}; SIGTERM now, SIGKILL after {job.grace_seconds:g} s")
            if job.handle:
                stop_now.append(job.handle)
        for r in d.resizes:
            job = s.get(Job, r.job_id)
            if r.in_place and self.resizes.start(s, job, r):
                continue
            if not move(s, job, JobState.RESIZING, r.reason, resize_to=r.workers, stop_requested_at=utcnow()):
                continue
            add_event(s, job, JobState.RESIZING, f"{r.reason}; it restarts from its checkpoint with {r.workers} workers"
                      + self.resizes.restart_note(job.id))
            if job.handle:
                stop_now.append(job.handle)
        for start in d.starts:
            job = s.get(Job, start.job_id)
            if not move(s, job, JobState.RUNNING, "", started_at=utcnow(), handle=None, resize_to=None,
                        stop_requested_at=None):
                continue
            Allocation(workers=list(start.placement)).save(job)
            gpus = sum(len(w.gpus) for w in start.placement)
            nodes = sorted({w.node for w in start.placement})
            again = f" (restart {job.restart_count})" if job.restart_count else ""
            add_event(s, job, "started", f"{len(start.placement)} workers, {gpus} GPUs on {', '.join(nodes)}: "
                                         f"{start.reason}{again}")
        for w in d.waits:
            job = s.get(Job, w.job_id)
            if job.reason != w.reason:
                if not same_reason(job.reason, w.reason):
                    add_event(s, job, "waiting", w.reason)
                job.reason = w.reason
        return d.starts, stop_now

    def start(self, start: Start) -> None:
        """Stage the job's datasets, then launch its workers (jobs/starting.py)."""
        start_run(self.sessions, self.fence, self.launcher, self.executor, start.job_id)

    # the loop ------------------------------------------------------------------
    def run(self, stop: threading.Event, interval: float = 0.5) -> None:
        run_ticks(self.tick, stop, interval, "reconcile", wake=self.wake, hurry=self.hurry)
