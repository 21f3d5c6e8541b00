"""The job controller, the scheduling loop: observe executors, apply cancels, ask the
policy (``deeppod.scheduler``), carry out its decisions.

The scheduler decides (pure), the executor acts; this module is the only place that
joins them with the store. Every tick is safe to repeat, which is what lets a
restarted server re-adopt jobs that kept running while it was down.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timezone
from pathlib import Path

from sqlalchemy import or_, select
from sqlalchemy.orm import Session, sessionmaker

from deeppod.auth.identities import Identities, tenant_identity
from deeppod.auth.roles import ALL, REPLICA
from deeppod.auth.service import issue_job_token, revoke_job_tokens
from deeppod.errors import DeepPodError, ExecutorError, NodeLost, NotLeader
from deeppod.executor.base import ExecStatus, Executor, LaunchSpec, WorkerSpec
from deeppod.cluster.leader import IDLE, run_rounds
from deeppod.cluster.service import NodeUsage, mark_down, usage_of
from deeppod.contract import (ENV_CA_CERT, ENV_JOINING, ENV_WORLD_FILE, ENV_WORLD_GENERATION, EXIT_RESUME, ACTIVE_STATES, HOLDING_STATES, JobState, base_environment, describe_exit,
                              worker_env)
from deeppod.jobs.progress import checkpoint_time, stop_outcome
from deeppod.jobs.resize import (IN_PLACE_TIMEOUT_S, clear_ready, joiners_ready, read_ack, reset_world, resizable,
                                 world_file, write_world)
from deeppod.jobs.service import add_event, finish
from deeppod.plans.service import current_plan
from deeppod.scheduler import Config, NodeState, PendingJob, RunningJob, Snapshot, Start, WorkerPlacement, schedule
from deeppod.store.models import Job, Node, Tenant, utcnow

log = logging.getLogger(__name__)
MAX_RESUMES = 100  # a job that keeps asking to be resumed is stopped at some point
JOINER_POLL_S = 0.01  # how often a grow's new workers are looked for, while they start


def outcome(job: Job, status: ExecStatus, kept: str = "") -> tuple[JobState, str]:
    """What a finished run means: succeeded, failed, cancelled, or requeue (preempted/resized).
    ``kept`` says what its checkpoint folder holds (progress.stop_outcome) for the stop cases."""
    if job.cancel_requested:
        return JobState.CANCELLED, "cancelled by request"
    tail = f"; {kept}" if kept else ""
    if job.stop_reason:
        return JobState(job.stop_as or JobState.STOPPED), job.stop_reason + tail
    if job.state in (JobState.PREEMPTED, JobState.RESIZING):
        return JobState.QUEUED, "requeued: " + (job.reason or str(job.state)) + tail
    codes = status.exit_codes
    if codes and all(c in (0, EXIT_RESUME) for c in codes.values()) and EXIT_RESUME in codes.values():
        return JobState.QUEUED, f"the job exited with {EXIT_RESUME} (resume me){tail}"
    if status.lost_nodes:
        return JobState.QUEUED, f"requeued: {status.reason}; it resumes from its last checkpoint"
    if status.lost:
        return JobState.FAILED, status.reason
    placed = {w["rank"] for w in job.placed_workers}  # workers that left in a shrink exited 0 too
    if codes and placed <= set(codes) and all(c == 0 for c in codes.values()):
        return JobState.SUCCEEDED, "all workers exited with code 0"
    if status.reason:
        return JobState.FAILED, status.reason
    bad = sorted((r, c) for r, c in codes.items() if c != 0)
    if bad:
        return JobState.FAILED, f"rank {bad[0][0]} {describe_exit(bad[0][1])}"
    return JobState.FAILED, "the job ended without every worker reporting an exit code"


def _run_service(job: Job) -> float:
    """GPU-seconds of the job's current run: its GPUs times the time since it started."""
    if job.started_at is None or not job.allocation:
        return 0.0
    started = job.started_at if job.started_at.tzinfo else job.started_at.replace(tzinfo=timezone.utc)
    gpus = sum(len(w["gpus"]) for w in job.placed_workers)
    return max(0.0, (utcnow() - started).total_seconds()) * gpus


def _run_seconds(job: Job) -> float:
    """Wall seconds since the current run (or size) started."""
    if job.started_at is None:
        return 0.0
    started = job.started_at if job.started_at.tzinfo else job.started_at.replace(tzinfo=timezone.utc)
    return max(0.0, (utcnow() - started).total_seconds())


def _same_reason(a: str, b: str) -> bool:
    """Waiting reasons differ only in counts from round to round; record real changes."""
    return re.sub(r"\d+", "#", a) == re.sub(r"\d+", "#", b)


@dataclass(frozen=True)
class Isolation:
    """Sandbox every worker as its tenant's OS identity (docs/security.md)."""

    identities: Identities
    python: tuple[str, ...]  # the Python environment, read-only in every sandbox
    writable: tuple[str, ...] = ("checkpoints", "model", "outputs", "tensorboard")  # of its folder: the job's to write
    shm_root: str = "/dev/shm"  # where each job's shared memory folder is made


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    if root.stat().st_uid == uid:  # done at an earlier start of the job (the root goes last)
        return
    for folder, dirs, files in os.walk(root, topdown=False):  # each folder once, after what it holds
        links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]  # not walked into
        for name in [*(os.path.join(folder, n) for n in files + links), folder]:
            os.lchown(name, uid, gid)


class JobController:
    def __init__(self, sessions: sessionmaker[Session], executor: Executor, *, jobs_dir: Path,
                 api_url: str, server_env: dict[str, str] | None = None, config: Config | None = None,
                 clock: Callable[[], float] = time.time, stage: Callable[[int], str] | None = None,
                 on_finished: Callable[[Session, Job], None] | None = None, isolation: Isolation | None = None,
                 ca_cert: str | None = None, fence: Callable[[Session], None] | None = None, spares: int = 0):
        self.sessions = sessions
        self.spares = spares  # warm spares per resizable job below its largest size (DEEPPOD_SPARE_WORKERS)
        # inside every deciding transaction: raises NotLeader unless this server leads
        # (cluster/leader.py); None: this server is the only one
        self.fence = fence or (lambda s: None)
        self.ca_cert = ca_cert  # the file jobs verify the server's TLS certificate with (None: system trust)
        self.isolation = isolation
        self.on_finished = on_finished  # called in the same transaction when a job ends for good
        self.stage = stage  # dataset version id -> its folder on the hot tier (copied there if cold)
        self.executor = executor
        self._grows: list[tuple[int, dict, list[WorkerSpec], int]] = []  # in-place grows decided, to start
        self.jobs_dir = jobs_dir
        self.api_url = api_url
        self.base_env = base_environment(dict(os.environ if server_env is None else server_env))
        self.config = config or Config()
        self.clock = clock
        self.last_round_ms = 0.0
        self.wake = threading.Event()  # set when a job is submitted in this process (server.build)
        self.hurry = threading.Event()  # set when a grow's new workers are ready: the next round tells the others
        self._watching: dict[int, threading.Event] = {}  # job -> set to end the watch on its joiners
        self.rounds = 0  # rounds completed (a new leader's first one is its first decision)

    def job_dir(self, job_id: int) -> Path:
        return self.jobs_dir / str(job_id)

    # one round -----------------------------------------------------------------
    def tick(self) -> str | None:
        with self.sessions.begin() as s:  # one query for a steady round: the active jobs
            jobs = list(s.scalars(select(Job).where(Job.state.in_(ACTIVE_STATES))))
            if not jobs and not self._grows:  # a round would decide nothing: an idle server stays idle
                self.rounds += 1
                return IDLE
            # fences the transaction itself, once it has something to write
            changed = self.observe(s, [j for j in jobs if j.state in HOLDING_STATES])
            # being cancelled or preempted: SIGTERM (again, after a restart: idempotent)
            stopping = [j.handle for j in jobs if j.state in HOLDING_STATES and j.handle is not None and j.stopping]
            active = [(j.state, j.workers, j.max_workers) for j in jobs]
        for handle in stopping:
            self.executor.terminate(handle)
        starts, stop_now = [], []
        if changed or self._grows or self._decidable(active):
            with self.sessions.begin() as s:
                self.fence(s)
                starts, stop_now = self.decide(s)
        for handle in stop_now:
            self.executor.terminate(handle)
        grows, self._grows = self._grows, []
        for job_id, handle, workers, generation in grows:
            self._add_workers(job_id, handle, workers, generation)
        for start in starts:
            self.start(start)
        self.rounds += 1

    def _decidable(self, active: list[tuple]) -> bool:
        """Whether the policy could decide anything: a job waits, an elastic one runs (it may
        grow into GPUs that freed up), or a node or GPU is sick (its jobs move). Otherwise
        every decision needs a waiting job, so the round skips the snapshot: a server that
        only runs fixed-size jobs and replicas idles."""
        if any(state == JobState.QUEUED or (top or 0) > workers for state, workers, top in active):
            return True
        with self.sessions() as s:
            return any(not (n.up and n.healthy) or not all(g.get("healthy", True) for g in n.gpus)
                       for n in s.scalars(select(Node)))

    def observe(self, s: Session, holding: list[Job]) -> bool:
        """Poll the jobs holding GPUs; record those that ended. Whether it wrote anything."""
        fenced = False
        held: dict[str, NodeUsage] | None = None  # per node, computed once, when a spare count needs it
        for job in holding:
            handle = job.handle or self.executor.find(job.id, self.job_dir(job.id))
            status = self.executor.poll(handle)
            resizing = bool((job.allocation or {}).get("resize"))
            spares = None if status.finished or resizing else 0
            if spares == 0 and self._may_keep_spares(job):
                held = usage_of(holding) if held is None else held
                spares = self._spares_for(s, job, held)
            respare = spares is not None and spares != (job.allocation or {}).get("spares", 0)
            if not fenced and (status.finished or resizing or respare):  # what follows writes: prove the lead first
                self.fence(s)
                fenced = True
            if not status.finished:
                if resizing:
                    self._follow_resize(s, job, status)
                elif respare:
                    self.executor.keep_spares(handle, spares)
                    if held is not None and job.placed_workers:  # the next jobs see the change
                        rank0 = job.placed_workers[0]
                        have = (job.allocation or {}).get("spares") or 0
                        held[rank0["node"]].memory_mb += (spares - have) * rank0["memory_mb"]
                    job.allocation = {**(job.allocation or {}), "spares": spares}
                continue
            asked = job.stop_requested_at.timestamp() if job.stop_requested_at else None
            state, reason = outcome(job, status, stop_outcome(self.job_dir(job.id) / "checkpoints", asked))
            revoke_job_tokens(s, job.id)
            if status.lost_nodes:
                mark_down(s, status.lost_nodes)
            if self.isolation is not None:  # its workers are gone: so is what they shared in memory
                shutil.rmtree(self._shm(job.id), ignore_errors=True)
            pending = (job.allocation or {}).get("resize")
            if pending and state == JobState.FAILED:  # a worker failed during the switch: restart instead
                self._requeue(s, job, f"the in-place resize to {pending['to']} workers failed ({reason}); it "
                                      f"restarts from its checkpoint with {pending['to']} workers", status)
            elif state == JobState.FAILED and job.restart_count < job.max_restarts:
                failed = {r for r, c in status.exit_codes.items() if c != 0} or {w["rank"] for w in job.placed_workers}
                job.avoid = [[w["node"], g] for w in job.placed_workers if w["rank"] in failed for g in w["gpus"]]
                self._requeue(s, job, f"{reason}; restart {job.restart_count + 1} of {job.max_restarts}, "
                                      "avoiding the failed GPUs", status)
            elif state == JobState.QUEUED and job.restart_count < MAX_RESUMES:
                self._requeue(s, job, reason, status)
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
        return fenced

    def _may_keep_spares(self, job: Job) -> bool:
        """Whether a running job may have warm spares at all (the cheap checks first)."""
        return bool(self.spares and job.state == JobState.RUNNING and not job.stopping and job.handle
                    and getattr(self.executor, "in_place", False) and job.placed_workers
                    and (job.max_workers or 0) > len(job.placed_workers))

    def _spares_for(self, s: Session, job: Job, held: dict[str, NodeUsage]) -> int:
        """How many warm spares a running job should have (runtime/spare.py): while it can
        grow in place, as many as it can grow by, up to ``self.spares``, and no more than
        the memory a worker asks for leaves room for on rank 0's node (``held``: what the
        jobs holding GPUs hold per node, this job's spares included); else none."""
        if not self._may_keep_spares(job) or not resizable(self.job_dir(job.id) / "checkpoints"):
            return 0  # a job that does not use runtime.Resizer would run a spare as one more worker
        workers = job.placed_workers
        want = min(self.spares, job.max_workers - len(workers))
        each = workers[0]["memory_mb"]
        if each:
            node = s.scalar(select(Node).where(Node.name == workers[0]["node"]))
            used = held.get(workers[0]["node"])
            have = (job.allocation or {}).get("spares") or 0  # counted in ``used`` already
            free = (node.memory_mb if node else 0) - (used.memory_mb if used else 0) + have * each
            want = min(want, max(0, int(free // each)))
        return want

    def _requeue(self, s: Session, job: Job, reason: str, status: ExecStatus | None = None, *,
                 ran: bool = True) -> None:
        """Back to the queue, same id. ``ran``: it ran (a restart, counted), else it never started."""
        job.state = JobState.QUEUED
        job.queued_at = utcnow()
        if ran:
            job.attained_gpu_seconds += _run_service(job)
            job.ran_seconds += _run_seconds(job)
            job.restart_count += 1
            job.exit_codes = {str(k): v for k, v in sorted(status.exit_codes.items())}
        job.allocation = None
        job.handle = None
        job.endpoint = None  # a restarted replica announces its new address
        job.reason = reason
        add_event(s, job, "requeued", reason)
        log.info("job %s requeued: %s", job.id, reason)

    def snapshot(self, s: Session) -> Snapshot:
        nodes = {n.name: n for n in s.scalars(select(Node))}
        plan, _ = current_plan(s)
        holding = list(s.execute(select(Job, Tenant.name).join(Tenant, Job.tenant_id == Tenant.id)
                                 .where(Job.state.in_(HOLDING_STATES))))
        use = usage_of(job for job, _ in holding)
        running = []
        for job, tenant in holding:
            workers = job.placed_workers
            started = (job.started_at or job.submitted_at).timestamp()
            pending = (job.allocation or {}).get("resize")
            if pending:  # the leaving workers' GPUs stay taken (not free) until they have exited
                workers = [w for w in workers if w["rank"] < pending["to"]]
                started = pending["decided_at"]
            ckpt = self.job_dir(job.id) / "checkpoints"
            running.append(RunningJob(
                id=job.id, tenant=tenant,
                placement=tuple(WorkerPlacement(w["rank"], w["node"], tuple(w["gpus"]), w["cpus"], w["memory_mb"])
                                for w in workers),
                gpus_per_worker=job.gpus_per_worker, min_workers=job.workers,
                max_workers=max(job.workers, job.max_workers or job.workers), priority=job.priority,
                preemptible=job.preemptible, started_at=started,
                last_checkpoint_at=checkpoint_time(ckpt),
                stopping=job.stopping, reclaim_first=job.kind == "trial" or (
                    job.idle_since is not None and plan.reclaim_idle_first),
                attained=job.attained_gpu_seconds + _run_service(job),
                in_place=bool(getattr(self.executor, "in_place", False)) and not pending and not job.stopping
                and job.handle is not None and resizable(ckpt)))
        node_states = []
        for n in nodes.values():
            good = [g["index"] for g in n.gpus if g.get("healthy", True)]
            held = use.get(n.name) or NodeUsage(set())
            node_states.append(NodeState(
                name=n.name, free_gpus=tuple(g for g in good if g not in held.gpus),
                free_cpus=n.cpus - held.cpus, free_memory_mb=n.memory_mb - held.memory_mb,
                healthy=n.healthy and n.up, total_gpus=len(good),
                sick_gpus=tuple(g["index"] for g in n.gpus if not g.get("healthy", True))))
        queued = tuple(
            PendingJob(id=j.id, tenant=t, workers=j.workers, gpus_per_worker=j.gpus_per_worker,
                       cpus_per_worker=j.cpus_per_worker, memory_mb_per_worker=j.memory_mb_per_worker or 0,
                       priority=j.priority, submitted_at=j.submitted_at.timestamp(), max_workers=j.max_workers,
                       preemptible=j.preemptible, resize_to=j.resize_to,
                       avoid=frozenset((node, int(g)) for node, g in (j.avoid or [])),
                       attained=j.attained_gpu_seconds,
                       queued_at=j.queued_at.timestamp() if j.queued_at else None)
            for j, t in s.execute(select(Job, Tenant.name).join(Tenant, Job.tenant_id == Tenant.id)
                                  .where(Job.state == JobState.QUEUED)))
        return Snapshot(nodes=tuple(node_states), queued=queued, running=tuple(running), plan=plan,
                        now=self.clock(), config=self.config)

    def decide(self, s: Session) -> tuple[list[Start], list[dict]]:
        """Ask the policy; record every decision with its reason. Resources are taken in the
        store before any process starts; stops are sent after the commit."""
        snap = self.snapshot(s)
        began = time.perf_counter()
        d = schedule(snap)
        self.last_round_ms = (time.perf_counter() - began) * 1000
        stop_now = []
        for p in d.preempts:
            job = s.get(Job, p.job_id)
            job.state, job.reason, job.stop_requested_at = JobState.PREEMPTED, p.reason, utcnow()
            add_event(s, job, JobState.PREEMPTED, f"{p.reason}; SIGTERM now, SIGKILL after {job.grace_seconds:g} s")
            if job.handle:
                stop_now.append(job.handle)
        for r in d.resizes:
            job = s.get(Job, r.job_id)
            if r.in_place and self._resize_in_place(s, job, r):
                continue
            job.state, job.reason, job.resize_to = JobState.RESIZING, r.reason, r.workers
            job.stop_requested_at = utcnow()
            add_event(s, job, JobState.RESIZING, f"{r.reason}; it restarts from its checkpoint with {r.workers} workers")
            if job.handle:
                stop_now.append(job.handle)
        for start in d.starts:
            job = s.get(Job, start.job_id)
            job.state = JobState.RUNNING
            job.started_at = utcnow()
            job.handle = None
            job.resize_to = None
            job.stop_requested_at = None
            job.reason = ""
            job.allocation = {"workers": [
                {"rank": w.rank, "node": w.node, "gpus": list(w.gpus), "cpus": w.cpus, "memory_mb": w.memory_mb}
                for w in start.placement]}
            gpus = sum(len(w.gpus) for w in start.placement)
            nodes = sorted({w.node for w in start.placement})
            again = f" (restart {job.restart_count})" if job.restart_count else ""
            add_event(s, job, "started", f"{len(start.placement)} workers, {gpus} GPUs on {', '.join(nodes)}: "
                                         f"{start.reason}{again}")
        for w in d.waits:
            job = s.get(Job, w.job_id)
            if job.reason != w.reason:
                if not _same_reason(job.reason, w.reason):
                    add_event(s, job, "waiting", w.reason)
                job.reason = w.reason
        return d.starts, stop_now

    # in-place resize (jobs/resize.py, runtime/resize.py) ------------------------------
    def _resize_in_place(self, s: Session, job: Job, r) -> bool:
        """Tell the running workers their new world; on a grow, start the new ones after the
        commit. False: it cannot be done in place (the restart path is taken instead)."""
        ckpt = self.job_dir(job.id) / "checkpoints"
        if not (getattr(self.executor, "in_place", False) and job.handle and resizable(ckpt)):
            return False
        alloc = dict(job.allocation or {})
        workers = list(alloc.get("workers", []))
        old, generation = len(workers), int(alloc.get("generation", 0)) + 1
        addresses = {n.name: n.address for n in s.scalars(select(Node))}
        first = workers[0]["node"]
        master_addr = addresses.get(first, "127.0.0.1")
        master_port = self.executor.port_on(first, master_addr)
        decided = self.clock()
        added = [{"rank": w.rank, "node": w.node, "gpus": list(w.gpus), "cpus": w.cpus, "memory_mb": w.memory_mb}
                 for w in r.added]
        world = {"generation": generation, "world_size": r.workers, "master_addr": master_addr,
                 "master_port": master_port, "decided_at": decided}
        pending = {"generation": generation, "from": old, "to": r.workers, "decided_at": decided}
        if r.workers > old:
            # the new workers start first; the world is told once they are ready (_follow_resize)
            workers += added
            clear_ready(ckpt, [w["rank"] for w in added])
            self._grows.append((job.id, dict(job.handle), self._joiners(s, job, workers, added, master_addr,
                                                                         master_port, generation), generation))
            pending.update(world=world, joiners=[w["rank"] for w in added])
        else:
            write_world(self.job_dir(job.id), world)
        alloc.update(workers=workers, generation=generation, resize=pending)
        job.allocation = alloc
        job.resize_to = r.workers  # if the switch fails, the restart is at the new size
        job.reason = r.reason
        how = ("the workers stay; ranks {}-{} leave".format(r.workers, old - 1) if r.workers < old
               else f"the workers stay; {r.workers - old} join and receive the model from rank 0")
        add_event(s, job, JobState.RESIZING, f"{r.reason}; in place: {how}")
        return True

    def _joiners(self, s: Session, job: Job, workers: list[dict], added: list[dict], master_addr: str,
                 master_port: int, generation: int) -> list[WorkerSpec]:
        token = issue_job_token(s, job.user_id, job.id, REPLICA if job.kind == "serve" else ALL)
        node_order = list(dict.fromkeys(w["node"] for w in workers))
        staged = (job.allocation or {}).get("staged") or {}
        specs = []
        for w in added:
            peers = [x for x in workers if x["node"] == w["node"]]
            env = self._env(job, staged, token, rank=w["rank"], world_size=len(workers), local_rank=peers.index(w),
                            local_world_size=len(peers), node_rank=node_order.index(w["node"]),
                            master_addr=master_addr, master_port=master_port, gpus=tuple(w["gpus"]),
                            cpus=w["cpus"], generation=generation)
            env[ENV_JOINING] = "1"
            if self.isolation:
                env["HOME"] = "/tmp"  # the sandbox's own
            specs.append(WorkerSpec(rank=w["rank"], node=w["node"], env=env))
        return specs

    def _add_workers(self, job_id: int, handle: dict, workers: list[WorkerSpec], generation: int) -> None:
        try:
            self.executor.add_workers(handle, workers, generation)
        except (DeepPodError, OSError) as exc:  # the workers that run wait for them: restart instead
            with self.sessions.begin() as s:
                self.fence(s)
                job = s.get(Job, job_id)
                self._fall_back(s, job, f"its new workers could not start ({exc})")
            return
        self._watch_joiners(job_id, [w.rank for w in workers])

    def _watch_joiners(self, job_id: int, ranks: list[int]) -> None:
        """Hurry the next round once the joiners are ready, so that the running workers are
        told at once rather than up to a round later (0.5 s: half a ResNet-50 grow from a warm
        spare on CPU). A thread that only looks at files, until they are ready, the resize
        ends another way (_stop_watching), or a switch could take no longer."""
        ckpt, done = self.job_dir(job_id) / "checkpoints", threading.Event()
        self._stop_watching(job_id)
        self._watching[job_id] = done

        def watch() -> None:
            deadline = time.monotonic() + IN_PLACE_TIMEOUT_S
            while time.monotonic() < deadline and not done.wait(JOINER_POLL_S):
                if joiners_ready(ckpt, ranks):
                    self.hurry.set()
                    break
            if self._watching.get(job_id) is done:  # not a later grow's watch
                del self._watching[job_id]

        threading.Thread(target=watch, name=f"joiners-{job_id}", daemon=True).start()

    def _stop_watching(self, job_id: int) -> None:
        done = self._watching.pop(job_id, None)
        if done is not None:
            done.set()

    def _follow_resize(self, s: Session, job: Job, status: ExecStatus) -> None:
        """A running job's in-place resize: done once rank 0 acknowledged a step at the new
        size and the leaving workers have exited; a restart if it takes too long."""
        alloc = dict(job.allocation)
        pending = dict(alloc["resize"])
        if job.stopping:  # preempted or cancelled meanwhile: it restarts (at the new size) anyway
            alloc.pop("resize")
            job.allocation = alloc
            self._stop_watching(job.id)
            return
        ckpt = self.job_dir(job.id) / "checkpoints"
        if pending.get("world") and joiners_ready(ckpt, pending["joiners"]):
            self._stop_watching(job.id)
            write_world(self.job_dir(job.id), pending.pop("world"))  # now the running workers switch
            alloc["resize"] = pending
            job.allocation = alloc
        ack = read_ack(ckpt)
        leavers = {w["rank"] for w in alloc["workers"] if w["rank"] >= pending["to"]}
        if (ack is not None and ack["generation"] >= pending["generation"] and not pending.get("world")
                and leavers <= set(status.exit_codes)):
            job.attained_gpu_seconds += _run_service(job)  # at the old size, until now
            job.ran_seconds += _run_seconds(job)
            job.started_at = utcnow()
            alloc["workers"] = [w for w in alloc["workers"] if w["rank"] < pending["to"]]
            alloc.pop("resize")
            if alloc.get("spares"):  # a grow may have used some: the next round says how many to keep now
                alloc["spares"] = None
            job.allocation = alloc
            job.resize_to = None
            took = float(ack.get("at", self.clock())) - float(pending["decided_at"])
            paused = ack.get("switch_seconds")
            paused = f" (training paused {float(paused):.1f} s)" if isinstance(paused, (int, float)) else ""
            add_event(s, job, "resized", f"in place from {pending['from']} to {pending['to']} workers: "
                                         f"{took:.1f} s from the decision to the first step at the new size{paused}")
            log.info("job %s resized in place to %s workers in %.1f s", job.id, pending["to"], took)
        elif self.clock() - float(pending["decided_at"]) > IN_PLACE_TIMEOUT_S:
            self._fall_back(s, job, f"the in-place resize did not finish in {IN_PLACE_TIMEOUT_S:g} s")

    def _fall_back(self, s: Session, job: Job, why: str) -> None:
        """Today's path: stop the job (SIGTERM, checkpoint) and start it again at the new size."""
        alloc = dict(job.allocation or {})
        pending = alloc.pop("resize", None)
        job.allocation = alloc
        self._stop_watching(job.id)
        if pending is None or job.stopping:
            return
        job.state, job.resize_to = JobState.RESIZING, pending["to"]
        job.reason = f"{why}; it restarts from its checkpoint with {pending['to']} workers"
        job.stop_requested_at = utcnow()
        add_event(s, job, JobState.RESIZING, job.reason)

    def _stage_datasets(self, job_id: int) -> dict[str, str]:
        """Bring the job's datasets to the hot tier before it starts: env var -> folder."""
        with self.sessions() as s:
            wanted = list(s.get(Job, job_id).datasets or [])
        if wanted and self.stage is None:
            raise ExecutorError("this server has no dataset store to stage from")
        return {d["env"]: self.stage(d["version_id"]) for d in wanted}

    def start(self, start: Start) -> None:
        try:
            staged = self._stage_datasets(start.job_id)
        except (DeepPodError, OSError) as exc:
            with self.sessions.begin() as s:
                self.fence(s)
                job = s.get(Job, start.job_id)
                finish(s, job, JobState.FAILED, f"could not stage its datasets: {exc}")
            log.warning("job %s could not stage its datasets: %s", start.job_id, exc)
            return
        with self.sessions.begin() as s:
            self.fence(s)
            job = s.get(Job, start.job_id)
            job.allocation = {**(job.allocation or {}), "staged": staged}  # joiners of an in-place grow get it too
            try:
                spec = self.launch_spec(s, job, start, staged)
                job.handle = self.executor.launch(spec)
            except NotLeader:  # nothing started; the job's row is rolled back with the transaction
                raise
            except NodeLost as exc:  # not the job's fault, and it never ran: it waits for other nodes
                mark_down(s, exc.nodes)
                revoke_job_tokens(s, job.id)
                self._requeue(s, job, f"requeued: {exc}", ran=False)
            except (DeepPodError, OSError) as exc:
                finish(s, job, JobState.FAILED, f"could not start: {exc}")
                revoke_job_tokens(s, job.id)
                log.warning("job %s could not start: %s", job.id, exc)

    def launch_spec(self, s: Session, job: Job, start: Start, staged: dict[str, str] | None = None) -> LaunchSpec:
        job_dir = self.job_dir(job.id)
        ckpt = job_dir / "checkpoints"
        ckpt.mkdir(parents=True, exist_ok=True)
        reset_world(job_dir, ckpt)
        token = issue_job_token(s, job.user_id, job.id, REPLICA if job.kind == "serve" else ALL)
        addresses = {n.name: n.address for n in s.scalars(select(Node))}
        first = start.placement[0]
        master_addr = addresses.get(first.node, "127.0.0.1")
        master_port = self.executor.port_on(first.node, master_addr)
        node_order = list(dict.fromkeys(w.node for w in start.placement))
        per_node = {n: [w for w in start.placement if w.node == n] for n in node_order}
        workers = []
        for w in start.placement:
            peers = per_node[w.node]
            env = self._env(job, staged or {}, token, rank=w.rank, world_size=len(start.placement),
                            local_rank=peers.index(w), local_world_size=len(peers),
                            node_rank=node_order.index(w.node), master_addr=master_addr, master_port=master_port,
                            gpus=w.gpus, cpus=w.cpus, generation=0)
            workers.append(WorkerSpec(rank=w.rank, node=w.node, env=env))
        sandbox = self._sandbox(s, job, job_dir, staged or {}) if self.isolation else None
        if sandbox is not None:
            for w in workers:
                w.env["HOME"] = "/tmp"  # the sandbox's own
        return LaunchSpec(job_id=job.id, job_dir=job_dir, command=list(job.command), workdir=job.workdir,
                          workers=workers, grace_seconds=job.grace_seconds,
                          memory_mb_per_worker=job.memory_mb_per_worker, sandbox=sandbox)

    def _env(self, job: Job, staged: dict[str, str], token: str, *, generation: int, **where) -> dict[str, str]:
        """One worker's environment: the job contract (``where``: its rank, world, rendezvous,
        GPUs), the server's CA, and the world file of an in-place resize."""
        job_dir = self.job_dir(job.id)
        env = worker_env(self.base_env, {**job.env, **staged}, job_id=job.id,
                         checkpoint_dir=str(job_dir / "checkpoints"), api_url=self.api_url, token=token,
                         restart_count=job.restart_count, params=job.params,
                         grace_seconds=job.grace_seconds, **where)
        if self.ca_cert:
            env[ENV_CA_CERT] = self.ca_cert
        env.update({ENV_WORLD_FILE: str(world_file(job_dir)), ENV_WORLD_GENERATION: str(generation)})
        return env

    def _shm(self, job_id: int) -> Path:
        return Path(self.isolation.shm_root) / f"deeppod-job-{job_id}"

    def _sandbox(self, s: Session, job: Job, job_dir: Path, staged: dict[str, str]) -> dict:
        """What the job's sandbox holds: its folders read-write (owned by its tenant's identity,
        nobody else's to read), its datasets and platform inputs read-only, nothing more."""
        who = tenant_identity(s, self.isolation.identities, job.tenant_id)
        os.chmod(job_dir, 0o711)  # its logs and the supervisor's files stay the server's
        binds = [] if job.workdir == "/" else [[job.workdir, job.workdir, True]]
        if Path(job.workdir).parent == job_dir:  # its own folder (code sent with it): the tenant's to write
            _chown_tree(Path(job.workdir), who.uid, who.gid)
        for name in self.isolation.writable:
            sub = job_dir / name
            sub.mkdir(exist_ok=True)
            os.chown(sub, who.uid, who.gid)
            os.chmod(sub, 0o700)
            binds.append([str(sub), str(sub), True])
        binds += [[path, path, False] for path in [*staged.values(), *(job.read_paths or [])]]
        binds.append([str(job_dir / "world"), str(job_dir / "world"), False])  # the control plane's word on its size
        if self.ca_cert:
            trust = os.path.dirname(self.ca_cert)
            binds.append([trust, trust, False])
        shm = self._shm(job.id)  # on the host's tmpfs, the job's alone
        shm.mkdir(mode=0o700, exist_ok=True)
        os.chown(shm, who.uid, who.gid)
        return {"uid": who.uid, "gid": who.gid, "workdir": job.workdir, "python": list(self.isolation.python),
                "binds": binds, "shm": str(shm)}

    # the loop ------------------------------------------------------------------
    def run(self, stop: threading.Event, interval: float = 0.5) -> None:
        run_rounds(self.tick, stop, interval, "reconcile", wake=self.wake, hurry=self.hurry)
