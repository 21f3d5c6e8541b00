"""The control plane's side of an in-place resize (the job's side: runtime/resize.py), and
the warm spares that make a grow fast.

The controller writes the job's world file (``JOB_DIR/world/world.json``, read-only to the
job): a generation, the new size and a fresh rendezvous port; on a grow, only once the new
workers (started first) say they are ready, so the others train meanwhile. A job that uses
``runtime.Resizer`` marks itself resizable and, after its first step at the new size,
acknowledges the generation in its checkpoint folder; the controller then trims the
workers that left from the job's allocation and records how long the switch took. One that
takes longer than IN_PLACE_TIMEOUT_S, or whose new workers cannot start, is restarted at
the new size from its checkpoint instead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from deeppod.cluster.service import NodeUsage
from deeppod.contract import ENV_JOINING, JobState
from deeppod.errors import DeepPodError
from deeppod.executor.base import ExecStatus, WorkerSpec
from deeppod.jobs.allocation import Allocation, PendingResize
from deeppod.jobs.launch import Launcher
from deeppod.jobs.runs import close_run
from deeppod.jobs.service import add_event, move
from deeppod.scheduler import Resize
from deeppod.store.models import Job, Node, utcnow

log = logging.getLogger(__name__)

#: an in-place resize not acknowledged within this many seconds falls back to a restart
IN_PLACE_TIMEOUT_S = 180.0
JOINER_POLL_S = 0.01  # how often a grow's new workers are looked for, while they start


@dataclass(frozen=True)
class Grow:
    """New workers of a running job, to start after the deciding transaction commits."""

    job_id: int
    handle: dict
    workers: list[WorkerSpec]
    generation: int


class Resizes:
    def __init__(self, sessions: sessionmaker[Session], launcher: Launcher, *, fence: Callable[[Session], None],
                 clock: Callable[[], float], spares: int = 0):
        self.sessions = sessions
        self.launcher = launcher
        self.executor = launcher.executor
        self.fence = fence
        self.clock = clock
        self.spares = spares  # warm spares per resizable job below its largest size (DEEPPOD_SPARE_WORKERS)
        self.grows: list[Grow] = []  # decided, to start after the commit
        self.hurry = threading.Event()  # set when a grow's new workers are ready: the next round tells the others
        self.watching: dict[int, threading.Event] = {}  # job -> set to end the watch on its joiners
        self.looks = 0  # how often the watches looked at the joiners' marks (what a test waits on)

    # deciding ------------------------------------------------------------------------
    def start(self, s: Session, job: Job, r: Resize) -> bool:
        """Tell the running workers their new world; on a grow, start the new ones after the
        commit. False: it cannot be done in place (the restart path is taken instead)."""
        folder = self.launcher.folder(job.id)
        if not (self.executor.in_place and job.handle and folder.resizable()):
            return False
        alloc = Allocation.of(job)
        old, generation = len(alloc.workers), alloc.generation + 1
        if job.network != "host" and any(w.node != alloc.workers[0].node for w in r.added):
            return False  # its own network holds one node's workers: a restart says so
        meet = self.launcher.rendezvous(s, job, alloc.workers[0].node)
        decided = self.clock()
        world = {"generation": generation, "world_size": r.workers, "master_addr": meet.master_addr,
                 "master_port": meet.master_port, "decided_at": decided}
        pending = PendingResize(generation, old, r.workers, decided)
        if r.workers > old:
            # the new workers start first; the world is told once they are ready (follow)
            added = list(r.added)
            alloc.workers += added
            folder.clear_ready([w.rank for w in added])
            specs = self.launcher.workers(s, job, alloc.workers, added, staged=alloc.staged,
                                          token=self.launcher.token(s, job), meet=meet, generation=generation)
            for spec in specs:
                spec.env[ENV_JOINING] = "1"
            self.grows.append(Grow(job.id, dict(job.handle), specs, generation))
            pending = PendingResize(generation, old, r.workers, decided, world, tuple(w.rank for w in added))
        else:
            folder.write_world(world)
        alloc.generation, alloc.resize = generation, pending
        alloc.save(job)
        job.resize_to = r.workers  # if the switch fails, the restart is at the new size
        job.reason = r.reason
        how = (f"the workers stay; ranks {r.workers}-{old - 1} leave" if r.workers < old
               else f"the workers stay; {r.workers - old} join and receive the model from rank 0")
        add_event(s, job, JobState.RESIZING, f"{r.reason}; in place: {how}")
        return True

    def restart_note(self, job_id: int) -> str:
        """Why the job said it resizes by a restart (a sharded model), for its event."""
        why = self.launcher.folder(job_id).restart_reason()
        return f" ({why})" if why else ""

    # after the commit ----------------------------------------------------------------
    def start_grows(self) -> None:
        grows, self.grows = self.grows, []
        for g in grows:
            try:
                self.executor.add_workers(g.handle, g.workers, g.generation)
            except (DeepPodError, OSError) as exc:  # the workers that run wait for them: restart instead
                with self.sessions.begin() as s:
                    self.fence(s)
                    self.fall_back(s, s.get(Job, g.job_id), f"its new workers could not start ({exc})")
                continue
            self._watch_joiners(g.job_id, [w.rank for w in g.workers])

    def _watch_joiners(self, job_id: int, ranks: list[int]) -> None:
        """Hurry the next round once the joiners are ready, so that the running workers are
        told at once rather than up to a round later (0.5 s: half a ResNet-50 grow from a warm
        spare on CPU). A thread that only looks at files, until they are ready, the resize
        ends another way (stop_watching), or a switch could take no longer."""
        folder, done = self.launcher.folder(job_id), threading.Event()
        self.stop_watching(job_id)
        self.watching[job_id] = done

        def watch() -> None:
            deadline = time.monotonic() + IN_PLACE_TIMEOUT_S
            while time.monotonic() < deadline and not done.wait(JOINER_POLL_S):
                ready = folder.joiners_ready(ranks)
                self.looks += 1
                if ready:
                    self.hurry.set()
                    break
            if self.watching.get(job_id) is done:  # not a later grow's watch
                del self.watching[job_id]

        threading.Thread(target=watch, name=f"joiners-{job_id}", daemon=True).start()

    def stop_watching(self, job_id: int) -> None:
        done = self.watching.pop(job_id, None)
        if done is not None:
            done.set()

    # each round, while it runs -------------------------------------------------------
    def follow(self, s: Session, job: Job, status: ExecStatus) -> None:
        """A running job's in-place resize: done once rank 0 acknowledged a step at the new
        size and the leaving workers have exited; a restart if it takes too long."""
        alloc = Allocation.of(job)
        pending = alloc.resize
        if job.stopping:  # preempted or cancelled meanwhile: it restarts (at the new size) anyway
            alloc.resize = None
            alloc.save(job)
            self.stop_watching(job.id)
            return
        folder = self.launcher.folder(job.id)
        if pending.world and folder.joiners_ready(pending.joiners):
            self.stop_watching(job.id)
            folder.write_world(pending.world)  # now the running workers switch
            alloc.resize = pending = PendingResize(pending.generation, pending.before, pending.to,
                                                   pending.decided_at, None, pending.joiners)
            alloc.save(job)
        ack = folder.read_ack()
        leavers = {w.rank for w in alloc.workers if w.rank >= pending.to}
        if (ack is not None and ack["generation"] >= pending.generation and not pending.world
                and leavers <= set(status.exit_codes)):
            close_run(job)  # at the old size, until now
            job.started_at = utcnow()
            alloc.workers = [w for w in alloc.workers if w.rank < pending.to]
            alloc.resize = None
            if alloc.spares:  # a grow may have used some: the next round says how many to keep now
                alloc.spares = None
            alloc.save(job)
            job.resize_to = None
            took = float(ack.get("at", self.clock())) - pending.decided_at
            paused = ack.get("switch_seconds")
            paused = f" (training paused {float(paused):.1f} s)" if isinstance(paused, (int, float)) else ""
            add_event(s, job, "resized", f"in place from {pending.before} to {pending.to} workers: "
                                         f"{took:.1f} s from the decision to the first step at the new size{paused}")
            log.info("job %s resized in place to %s workers in %.1f s", job.id, pending.to, took)
        elif self.clock() - pending.decided_at > IN_PLACE_TIMEOUT_S:
            self.fall_back(s, job, f"the in-place resize did not finish in {IN_PLACE_TIMEOUT_S:g} s")

    def fall_back(self, s: Session, job: Job, why: str) -> None:
        """The restart path: stop the job (SIGTERM, checkpoint) and start it again at the new size."""
        alloc = Allocation.of(job)
        pending, alloc.resize = alloc.resize, None
        alloc.save(job)
        self.stop_watching(job.id)
        if pending is None or job.stopping:
            return
        if not move(s, job, JobState.RESIZING, f"{why}; it restarts from its checkpoint with {pending.to} workers",
                    resize_to=pending.to, stop_requested_at=utcnow()):
            return
        add_event(s, job, JobState.RESIZING, job.reason)

    # warm spares (runtime/spare.py) ---------------------------------------------------
    def may_keep_spares(self, job: Job) -> bool:
        """Whether a running job may have warm spares at all (the cheap checks first)."""
        return bool(self.spares and job.state == JobState.RUNNING and not job.stopping and job.handle
                    and self.executor.in_place and job.placed_workers
                    and (job.max_workers or 0) > len(job.placed_workers))

    def spares_for(self, s: Session, job: Job, held: dict[str, NodeUsage]) -> int:
        """How many warm spares a running job should have: while it can grow in place, as many
        as it can grow by, up to ``self.spares``, and no more than the memory a worker asks for
        leaves room for on rank 0's node (``held``: what the jobs holding GPUs hold per node,
        this job's spares included); else none."""
        if not self.may_keep_spares(job) or not self.launcher.folder(job.id).resizable():
            return 0  # a job that does not use runtime.Resizer would run a spare as one more worker
        alloc = Allocation.of(job)
        want = min(self.spares, job.max_workers - len(alloc.workers))
        rank0 = alloc.workers[0]
        node = s.scalar(select(Node).where(Node.name == rank0.node))
        if rank0.gpus and node is not None and any(not g.get("logical") for g in node.gpus or []):
            return 0  # a spare holds no GPU device (executor/sandbox.py): a GPU worker would not start from one
        if rank0.memory_mb:
            used = held.get(rank0.node)
            have = alloc.spares or 0  # counted in ``used`` already
            free = (node.memory_mb if node else 0) - (used.memory_mb if used else 0) + have * rank0.memory_mb
            want = min(want, max(0, int(free // rank0.memory_mb)))
        return want

    def keep_spares(self, job: Job, handle: dict, spares: int, held: dict[str, NodeUsage] | None) -> None:
        """Tell the executor; the next jobs of the round see the memory they take (``held``)."""
        self.executor.keep_spares(handle, spares)
        alloc = Allocation.of(job)
        if held is not None and alloc.workers:
            rank0 = alloc.workers[0]
            held[rank0.node].memory_mb += (spares - (alloc.spares or 0)) * rank0.memory_mb
        alloc.spares = spares
        alloc.save(job)
