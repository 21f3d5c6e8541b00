"""The reconcile loop: observe executors, apply cancels, ask the policy, start jobs.

The scheduler decides (pure), the executor acts; this module is the only place that
joins them with the store. Every tick is safe to repeat, which is what lets a
restarted server re-adopt jobs that kept running while it was down.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from deeppod.auth.service import issue_job_token, revoke_job_tokens
from deeppod.errors import DeepPodError
from deeppod.executor.base import ExecStatus, Executor, LaunchSpec, WorkerSpec
from deeppod.executor.supervisor import describe_exit
from deeppod.jobs.contract import base_environment, worker_env
from deeppod.jobs.service import add_event, finish
from deeppod.scheduler import NodeState, PendingJob, Snapshot, Start, schedule
from deeppod.store.models import Job, Node, Tenant, utcnow

log = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def final_state(job: Job, status: ExecStatus) -> tuple[str, str]:
    if job.cancel_requested:
        return "cancelled", "cancelled by request"
    if status.lost:
        return "failed", status.reason
    codes = status.exit_codes
    if len(codes) == job.workers and all(c == 0 for c in codes.values()):
        return "succeeded", "all workers exited with code 0"
    if status.reason:
        return "failed", status.reason
    bad = sorted((r, c) for r, c in codes.items() if c != 0)
    if bad:
        return "failed", f"rank {bad[0][0]} {describe_exit(bad[0][1])}"
    return "failed", "the job ended without every worker reporting an exit code"


class Reconciler:
    def __init__(self, sessions: sessionmaker[Session], executor: Executor, *, jobs_dir: Path,
                 api_url: str, server_env: dict[str, str] | None = None):
        self.sessions = sessions
        self.executor = executor
        self.jobs_dir = jobs_dir
        self.api_url = api_url
        self.base_env = base_environment(dict(os.environ if server_env is None else server_env))

    def job_dir(self, job_id: int) -> Path:
        return self.jobs_dir / str(job_id)

    # one round -----------------------------------------------------------------
    def tick(self) -> None:
        with self.sessions.begin() as s:
            self.observe(s)
        with self.sessions.begin() as s:
            self.apply_cancels(s)
        with self.sessions.begin() as s:
            starts = self.decide(s)
        for start in starts:
            self.start(start)

    def observe(self, s: Session) -> None:
        for job in s.scalars(select(Job).where(Job.state == "running")):
            handle = job.handle or {"kind": "local", "job_dir": str(self.job_dir(job.id))}
            status = self.executor.poll(handle)
            if not status.finished:
                continue
            state, reason = final_state(job, status)
            finish(s, job, state, reason, status.exit_codes)
            revoke_job_tokens(s, job.id)
            log.info("job %s %s: %s", job.id, state, reason)

    def apply_cancels(self, s: Session) -> None:
        for job in s.scalars(select(Job).where(Job.state == "running", Job.cancel_requested.is_(True))):
            if job.handle:
                self.executor.terminate(job.handle)

    def snapshot(self, s: Session) -> Snapshot:
        nodes = {n.name: n for n in s.scalars(select(Node))}
        used_gpus: dict[str, set[int]] = {name: set() for name in nodes}
        used_cpus = {name: 0.0 for name in nodes}
        used_mem = {name: 0 for name in nodes}
        for job in s.scalars(select(Job).where(Job.state == "running")):
            for w in (job.allocation or {}).get("workers", []):
                if w["node"] in nodes:
                    used_gpus[w["node"]].update(w["gpus"])
                    used_cpus[w["node"]] += w["cpus"]
                    used_mem[w["node"]] += w["memory_mb"]
        node_states = tuple(
            NodeState(
                name=n.name,
                free_gpus=tuple(g["index"] for g in n.gpus if g["index"] not in used_gpus[n.name]),
                free_cpus=n.cpus - used_cpus[n.name],
                free_memory_mb=n.memory_mb - used_mem[n.name],
                healthy=n.healthy,
            ) for n in nodes.values())
        queued = tuple(
            PendingJob(id=j.id, tenant=t, workers=j.workers, gpus_per_worker=j.gpus_per_worker,
                       cpus_per_worker=j.cpus_per_worker, memory_mb_per_worker=j.memory_mb_per_worker or 0,
                       priority=j.priority, submitted_at=j.submitted_at.timestamp())
            for j, t in s.execute(select(Job, Tenant.name).join(Tenant, Job.tenant_id == Tenant.id)
                                  .where(Job.state == "queued")))
        return Snapshot(nodes=node_states, queued=queued)

    def decide(self, s: Session) -> list[Start]:
        """Ask the policy and commit its starts (resources are taken before any process runs)."""
        starts = schedule(self.snapshot(s))
        for start in starts:
            job = s.get(Job, start.job_id)
            job.state = "running"
            job.started_at = utcnow()
            job.handle = None
            job.allocation = {"workers": [
                {"rank": w.rank, "node": w.node, "gpus": list(w.gpus), "cpus": w.cpus, "memory_mb": w.memory_mb}
                for w in start.placement]}
            gpus = sum(len(w.gpus) for w in start.placement)
            nodes = sorted({w.node for w in start.placement})
            add_event(s, job, "started", f"{start.reason}: {job.workers} workers, {gpus} GPUs on {', '.join(nodes)}")
        return starts

    def start(self, start: Start) -> None:
        with self.sessions.begin() as s:
            job = s.get(Job, start.job_id)
            try:
                spec = self.launch_spec(s, job, start)
                job.handle = self.executor.launch(spec)
            except (DeepPodError, OSError) as exc:
                finish(s, job, "failed", f"could not start: {exc}")
                revoke_job_tokens(s, job.id)
                log.warning("job %s could not start: %s", job.id, exc)

    def launch_spec(self, s: Session, job: Job, start: Start) -> LaunchSpec:
        job_dir = self.job_dir(job.id)
        ckpt = job_dir / "checkpoints"
        ckpt.mkdir(parents=True, exist_ok=True)
        token = issue_job_token(s, job.user_id, job.id)
        addresses = {n.name: n.address for n in s.scalars(select(Node))}
        first = start.placement[0]
        master_addr = addresses.get(first.node, "127.0.0.1")
        master_port = free_port(master_addr)
        node_order = list(dict.fromkeys(w.node for w in start.placement))
        per_node = {n: [w for w in start.placement if w.node == n] for n in node_order}
        workers = []
        for w in start.placement:
            peers = per_node[w.node]
            env = worker_env(
                self.base_env, job.env, job_id=job.id, rank=w.rank, world_size=len(start.placement),
                local_rank=peers.index(w), local_world_size=len(peers), node_rank=node_order.index(w.node),
                master_addr=master_addr, master_port=master_port, gpus=w.gpus, cpus=w.cpus,
                checkpoint_dir=str(ckpt), api_url=self.api_url, token=token, restart_count=job.restart_count)
            workers.append(WorkerSpec(rank=w.rank, node=w.node, env=env))
        return LaunchSpec(job_id=job.id, job_dir=job_dir, command=list(job.command), workdir=job.workdir,
                          workers=workers, grace_seconds=job.grace_seconds,
                          memory_mb_per_worker=job.memory_mb_per_worker)

    # the loop ------------------------------------------------------------------
    def run(self, stop: threading.Event, interval: float = 0.5) -> None:
        while not stop.is_set():
            began = time.monotonic()
            try:
                self.tick()
            except Exception:  # the loop must outlive one bad round; the next one retries
                log.exception("reconcile round failed")
            stop.wait(max(0.0, interval - (time.monotonic() - began)))
