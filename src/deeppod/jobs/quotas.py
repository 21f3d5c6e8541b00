"""The disk tenants' job folders take (checkpoints, outputs, models, logs, code) and their
jobs' Python environments (as measured when built), measured against the plan's
``storage_gb`` quotas; and the limits a plan sets on jobs: processes per worker, the package
indexes their requirements may name.

Measured, not enforced by the kernel (project quotas are a file system's mount option an
administrator may not have): every round (DEEPPOD_STORAGE_INTERVAL) each running job's folder
is walked (finished jobs' sizes are kept, their folders no longer change). A tenant over its
quota cannot submit, and its running jobs that wrote more since the last round are stopped
and fail with the reason; docs/security.md says what this leaves.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from deeppod.contract import ACTIVE_STATES, FINAL_STATES, JobState
from deeppod.envs.service import tenant_bytes
from deeppod.errors import Forbidden, InvalidRequest
from deeppod.job_folder import JobFolder
from deeppod.jobs.stopping import request_stop
from deeppod.nofollow import tree_bytes
from deeppod.plans.service import plan_now
from deeppod.scheduler.plan import MIN_PIDS, Plan
from deeppod.store.models import Job, Model, ModelVersion, Node, Tenant

log = logging.getLogger(__name__)
GB = 1_000_000_000


def check_pids(session: Session, tenant: str, asked: int | None, default: int) -> None:
    """A job's ``pids_per_worker``: at least MIN_PIDS, at most what the plan gives its tenant, or,
    where the plan says nothing, the server's default (``default``): a member cannot pick a
    limit of its own above what an administrator set."""
    if asked is None:
        return
    if asked < MIN_PIDS:
        raise InvalidRequest(f"pids_per_worker must be at least {MIN_PIDS} (got {asked}): a worker's Python and "
                             "its threads need that many")
    cap = plan_now(session).pids_cap(tenant)
    limit, whose = (cap, "the plan") if cap is not None else (default, "this server (DEEPPOD_PIDS_PER_WORKER)")
    if asked > limit:
        raise Forbidden(f"{whose} lets tenant {tenant!r}'s workers have at most {limit} processes and threads "
                        f"each; ask for {limit} or fewer, or ask an administrator to raise pids_per_worker in the "
                        "plan", code="over_limit")


def check_asks(session: Session, tenant: str, *, memory_mb: int | None, cpus: float | None,
               gpu_memory_mb: int | None) -> None:
    """What a job asks for each worker (and each of its GPUs) against its plan's caps
    (scheduler/plan.py LIMIT_FIELDS): a member cannot ask for more than an administrator allowed.
    Where the plan says nothing the nodes bound it (a job no node can hold is refused)."""
    plan = plan_now(session)
    asks = (("memory_gb_per_worker", memory_mb / 1024 if memory_mb else None, "GiB of memory per worker", "--memory"),
            ("cpus_per_worker", cpus, "CPUs per worker", "--cpus-per-worker"),
            ("gpu_memory_gb", gpu_memory_mb / 1024 if gpu_memory_mb else None, "GiB of memory on each GPU",
             "--gpu-memory"))
    for key, asked, what, option in asks:
        cap = plan.cap(tenant, key)
        if cap is not None and asked is not None and asked > cap * (1 + 1e-9):
            raise Forbidden(f"the plan lets tenant {tenant!r}'s jobs ask for at most {cap:g} {what} (this one asks "
                            f"{asked:g}); ask for {cap:g} or less ({option}), or ask an administrator to raise {key} "
                            "in the plan", code="over_limit")


def memory_for(session: Session, job: Job, tenant: str, nodes: set[str]) -> int | None:
    """The memory (MiB) each of ``job``'s workers may use, enforced by the kernel: its own ask
    (never above its plan's cap, which may have been lowered since), else its plan's cap, else
    what the smallest of ``nodes`` (where it runs) offers to jobs: a job that asks nothing still
    cannot take the host's memory beyond that (the server's and the system's)."""
    cap = plan_now(session).cap(tenant, "memory_gb_per_worker")
    cap_mb = int(cap * 1024) if cap is not None else None
    if job.memory_mb_per_worker:
        return min(job.memory_mb_per_worker, cap_mb) if cap_mb else job.memory_mb_per_worker
    if cap_mb:
        return cap_mb
    offered = [m for m in session.scalars(select(Node.memory_mb).where(Node.name.in_(nodes))) if m] if nodes else []
    return min(offered) if offered else None


def check_indexes(session: Session, tenant: str, urls: list[str]) -> None:
    """The package indexes a job's requirements name: each one the plan allows its tenant."""
    if not urls:
        return
    allowed = plan_now(session).package_indexes(tenant)
    refused = [u for u in urls if u.rstrip("/") not in allowed]
    if refused:
        raise Forbidden(f"the plan does not let tenant {tenant!r}'s jobs install from {', '.join(refused)}; remove "
                        "the --index-url / --extra-index-url line (the server's index is used), or ask an "
                        "administrator to add it to the plan's package_indexes", code="index_not_allowed")


def pids_for(session: Session, job: Job, tenant: str, default: int) -> int:
    """The processes and threads each of ``job``'s workers may have: its own ask, else its plan's
    cap, else the server's default (never above the plan's cap, which may have been lowered since)."""
    cap = plan_now(session).pids_cap(tenant)
    want = job.pids_per_worker or (cap if cap is not None else default)
    return min(want, cap) if cap is not None else want


def _over(plan: Plan, used: dict[str, int]) -> dict[str, str]:
    """Tenant -> why it is over a quota, for every tenant under a node whose folders take more than its quota."""
    out: dict[str, str] = {}
    for node, gb, tenants in plan.storage_quotas():
        total = sum(used.get(t, 0) for t in tenants)
        if total > gb * GB:
            why = (f"the job folders, registered models and environments of "
                   f"{'tenant ' + repr(node) if tenants == [node] else repr(node) + ' and its tenants'} "
                   f"take {total / GB:.2f} GB, over the plan's storage quota of {gb:g} GB: remove finished jobs' "
                   "folders ('deeppod jobs purge'), old model versions ('deeppod models rm') or Python "
                   "environments ('deeppod envs rm'), or ask an administrator to raise storage_gb")
            for t in tenants:
                out.setdefault(t, why)
    return out


def quota_left(session: Session, tenant: str) -> int | None:
    """Bytes the tenant may still add before a storage quota of the plan is reached (as last
    measured, with what was registered since); None where no quota covers it."""
    quotas = [(gb, tenants) for _, gb, tenants in plan_now(session).storage_quotas() if tenant in tenants]
    if not quotas:
        return None
    used = {name: b or 0 for name, b in session.execute(select(Tenant.name, Tenant.storage_bytes))}
    return max(0, min(int(gb * GB) - sum(used.get(t, 0) for t in tenants) for gb, tenants in quotas))


def check_submit(session: Session, tenant: str) -> None:
    """A tenant over its storage quota (as last measured) cannot start more jobs."""
    plan = plan_now(session)
    if not plan.storage_quotas():
        return
    used = {name: b or 0 for name, b in session.execute(select(Tenant.name, Tenant.storage_bytes))}
    if why := _over(plan, used).get(tenant):
        raise Forbidden(why, code="over_quota")


@dataclass
class StorageMeter:
    """Measures every tenant's job folders each round; keeps what no longer changes."""

    sessions: sessionmaker
    jobs_dir: Path
    envs_root: Path | None = None  # DEEPPOD_ENV_DIR: each tenant's environments count too
    final: dict[int, int] = field(default_factory=dict)  # finished job -> bytes (its folder does not change)
    last: dict[int, int] = field(default_factory=dict)  # running job -> bytes at the last round

    def tick(self) -> dict[str, int]:
        """Measure, record each tenant's total, stop the writers of tenants over a quota;
        returns tenant -> bytes."""
        with self.sessions() as s:
            rows = s.execute(select(Job.id, Job.tenant_id, Job.state).where(Job.purged_at.is_(None))).all()
            names = dict(s.execute(select(Tenant.id, Tenant.name)).all())
        used: dict[str, int] = defaultdict(int)
        grew: list[int] = []
        seen = set()
        for job_id, tenant_id, state in rows:
            seen.add(job_id)
            if job_id in self.final:
                size = self.final[job_id]
            else:
                size = tree_bytes(JobFolder.of(self.jobs_dir, job_id).root)
                if state in FINAL_STATES:
                    self.final[job_id] = size
                    self.last.pop(job_id, None)
                elif state in ACTIVE_STATES:
                    if size > self.last.get(job_id, size):
                        grew.append(job_id)
                    self.last[job_id] = size
            used[names.get(tenant_id, "")] += size
        for gone in set(self.final) - seen:  # purged
            del self.final[gone]
        for tenant_id, size in (tenant_bytes(self.envs_root) if self.envs_root else {}).items():
            used[names.get(tenant_id, "")] += size
        with self.sessions() as s:  # the registry's copies are the tenant's too (their sizes are recorded)
            for tenant_id, size in s.execute(select(Model.tenant_id, func.sum(ModelVersion.bytes))
                                             .join(ModelVersion, ModelVersion.model_id == Model.id)
                                             .group_by(Model.tenant_id)):
                used[names.get(tenant_id, "")] += int(size or 0)
        self._record(used, grew)
        return dict(used)

    def _record(self, used: dict[str, int], grew: list[int]) -> None:
        with self.sessions.begin() as s:
            for tenant in s.scalars(select(Tenant)):
                tenant.storage_bytes = used.get(tenant.name, 0)
            over = _over(plan_now(s), used)
            if not over:
                return
            for job_id in grew:  # the writers: a job of the tenant that wrote nothing since keeps running
                job = s.get(Job, job_id)
                why = over.get(s.get(Tenant, job.tenant_id).name)
                if why and job.state == JobState.RUNNING and not job.stopping:
                    request_stop(s, job, why, stop_as=JobState.FAILED)
                    log.warning("job %s stopped: %s", job.id, why)
