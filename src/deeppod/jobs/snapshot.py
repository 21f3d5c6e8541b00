"""The store's rows as the scheduler's input: nodes with what is free on them, the jobs
holding GPUs and the jobs waiting (``deeppod.scheduler.Snapshot``)."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.orm import Session

from deeppod.cluster.gpus import gpu_memory_of
from deeppod.cluster.service import NodeUsage, usage_of
from deeppod.contract import HOLDING_STATES, JobState
from deeppod.job_folder import JobFolder
from deeppod.jobs.allocation import Allocation
from deeppod.jobs.progress import checkpoint_time
from deeppod.jobs.runs import current_run_service
from deeppod.plans.service import plan_now
from deeppod.scheduler import Config, NodeState, PendingJob, RunningJob, Snapshot
from deeppod.scheduler.topology import Topology
from deeppod.store.models import Job, Node, Tenant


def snapshot(s: Session, *, folder: Callable[[int], JobFolder], in_place: bool, config: Config,
             now: float) -> Snapshot:
    """``folder``: a job's folder (its checkpoint says when it last saved, and whether it can
    resize in place); ``in_place``: the executor can add and remove workers of a running job."""
    plan = plan_now(s)
    holding = list(s.execute(select(Job, Tenant.name).join(Tenant, Job.tenant_id == Tenant.id)
                             .where(Job.state.in_(HOLDING_STATES))))
    running = tuple(_running(job, tenant, folder(job.id), in_place, plan.reclaim_idle_first)
                    for job, tenant in holding)
    use = usage_of(job for job, _ in holding)
    nodes = tuple(_node(n, use.get(n.name) or NodeUsage(set())) for n in s.scalars(select(Node)))
    # columns, not Job rows: a deep queue is read every round (no ORM identity, no env unsealed)
    queued = tuple(_queued(row) for row in s.execute(
        select(*QUEUED_COLUMNS, Tenant.name.label("tenant")).join(Tenant, Job.tenant_id == Tenant.id)
        .where(Job.state == JobState.QUEUED)))
    return Snapshot(nodes=nodes, queued=queued, running=running, plan=plan, now=now, config=config)


def _running(job: Job, tenant: str, folder: JobFolder, in_place: bool, reclaim_idle_first: bool) -> RunningJob:
    alloc = Allocation.of(job)
    workers, started = alloc.workers, (job.started_at or job.submitted_at).timestamp()
    if alloc.resize is not None:  # the leaving workers' GPUs stay taken (not free) until they have exited
        workers = [w for w in workers if w.rank < alloc.resize.to]
        started = alloc.resize.decided_at
    return RunningJob(
        id=job.id, tenant=tenant,
        placement=tuple(workers),
        gpus_per_worker=job.gpus_per_worker, min_workers=job.workers,
        max_workers=max(job.workers, job.max_workers or job.workers), priority=job.priority,
        preemptible=job.preemptible, started_at=started, last_checkpoint_at=checkpoint_time(folder.checkpoints),
        stopping=job.stopping,
        reclaim_first=job.kind == "trial" or (job.idle_since is not None and reclaim_idle_first),
        attained=job.attained_gpu_seconds + current_run_service(job),
        in_place=in_place and alloc.resize is None and not job.stopping and job.handle is not None
        and folder.resizable(), gpu_memory_mb=job.gpu_memory_mb or 0)


def _node(n: Node, held: NodeUsage) -> NodeState:
    good = [g["index"] for g in n.gpus if g.get("healthy", True)]
    return NodeState(name=n.name, free_gpus=tuple(g for g in good if g not in held.gpus),
                     free_cpus=n.cpus - held.cpus, free_memory_mb=n.memory_mb - held.memory_mb,
                     healthy=n.healthy and n.up, total_gpus=len(good),
                     sick_gpus=tuple(g["index"] for g in n.gpus if not g.get("healthy", True)),
                     topology=topology_of(n.gpus), gpu_memory_mb=gpu_memory_of(n.gpus), burst=n.burst)


def topology_of(gpus: list[dict]) -> Topology | None:
    """The node's GPU links as its inventory recorded them (cluster/nvml.py), if every GPU has
    them; None otherwise (logical slots, or a driver that did not say)."""
    rows = [g.get("links") for g in sorted(gpus, key=lambda g: g["index"])]
    if len(rows) < 2 or any(not r or len(r) != len(rows) for r in rows) or \
            [g["index"] for g in sorted(gpus, key=lambda g: g["index"])] != list(range(len(rows))):
        return None
    return Topology(tuple(tuple(int(x) for x in r) for r in rows))


QUEUED_COLUMNS = (Job.id, Job.workers, Job.gpus_per_worker, Job.cpus_per_worker, Job.memory_mb_per_worker,
                  Job.priority, Job.submitted_at, Job.max_workers, Job.preemptible, Job.resize_to, Job.avoid,
                  Job.attained_gpu_seconds, Job.queued_at, Job.gpu_memory_mb)


def _queued(j) -> PendingJob:
    return PendingJob(id=j.id, tenant=j.tenant, workers=j.workers, gpus_per_worker=j.gpus_per_worker,
                      cpus_per_worker=j.cpus_per_worker, memory_mb_per_worker=j.memory_mb_per_worker or 0,
                      priority=j.priority, submitted_at=j.submitted_at.timestamp(), max_workers=j.max_workers,
                      preemptible=j.preemptible, resize_to=j.resize_to,
                      avoid=frozenset((node, int(g)) for node, g in (j.avoid or [])),
                      attained=j.attained_gpu_seconds,
                      queued_at=j.queued_at.timestamp() if j.queued_at else None,
                      gpu_memory_mb=j.gpu_memory_mb or 0)
