"""Samples in the store: recorded with the job and tenant holding each GPU, checked for idle
and faulty GPUs, rolled up and dropped with age (bounded storage), read back for jobs, nodes
and ``deeppod top``. Takes the DB session."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from deeppod.auth import scope
from deeppod.auth.service import Principal
from deeppod.cluster.readings import GpuReading, HostReading
from deeppod.cluster.service import set_gpu_health
from deeppod.contract import HOLDING_STATES
from deeppod.executor.usage import Usage
from deeppod.store.events import add_event
from deeppod.store.models import GpuSample, HostSample, Job, JobSample, Node, utcnow

log = logging.getLogger(__name__)
GPU_FIELDS = ("util", "memory_used_mb", "memory_total_mb", "power_w", "temperature_c")
HOST_FIELDS = ("cpu_percent", "memory_used_mb", "memory_total_mb", "disk_used_percent", "net_rx_bps", "net_tx_bps")


@dataclass(frozen=True)
class Policy:
    """What counts as idle, and how long samples are kept (settings: DEEPPOD_MONITOR_*)."""

    idle_util: float = 5.0  # percent: a GPU under this is idle
    idle_after_s: float = 1800.0  # a job idle on all its GPUs this long gets an "idle-gpus" event
    raw_keep_s: float = 3600.0  # raw samples kept this long, then averaged into rollup_s buckets
    rollup_s: int = 60
    retention_s: float = 7 * 86400.0  # buckets dropped after this


def holders(session: Session) -> dict[tuple[str, int], Job]:
    """(node, gpu index) -> the job holding it."""
    out = {}
    for job in session.scalars(select(Job).where(Job.state.in_(HOLDING_STATES))):
        for w in job.placed_workers:
            for g in w["gpus"]:
                out[(w["node"], int(g))] = job
    return out


def record(session: Session, node_name: str, gpus: list[GpuReading], host: HostReading | None, at: float,
           policy: Policy = Policy(), held: dict[tuple[str, int], Job] | None = None) -> list[str]:
    """Store one reading of a node; cordon GPUs that report hardware errors; track idle jobs.
    Returns what it did worth a log line. ``held``: :func:`holders`, read once for many nodes."""
    held = holders(session) if held is None else held
    node = session.scalar(select(Node).where(Node.name == node_name))
    previous = _last_raw(session, node_name, [r.index for r in gpus])
    notes = []
    for r in gpus:
        job = held.get((node_name, r.index))
        session.add(GpuSample(node=node_name, gpu=r.index, at=at, period=0, util=r.util,
                              memory_used_mb=r.memory_used_mb, memory_total_mb=r.memory_total_mb, power_w=r.power_w,
                              temperature_c=r.temperature_c, ecc_uncorrected=r.ecc_uncorrected, xid=r.xid,
                              job_id=job.id if job else None, tenant_id=job.tenant_id if job else None))
        before = previous.get(r.index)
        fault = _fault(r, before)
        if fault and node is not None:
            notes.append(_cordon(session, node, r.index, fault, job))
    if host is not None:
        session.add(HostSample(node=node_name, at=at, period=0,
                               **{f: float(getattr(host, f)) for f in HOST_FIELDS}))
    since_last = at - max((p.at for p in previous.values()), default=at)
    notes += _idle(session, node_name, gpus, held, at, since_last, policy)
    return notes


def _last_raw(session: Session, node_name: str, gpus: list[int]) -> dict[int, GpuSample]:
    """Each GPU's newest raw sample: one index probe per GPU (period, node, gpu, at), where a
    max over the node's samples reads every one of the last hour's."""
    out = {}
    for g in gpus:
        row = session.scalars(select(GpuSample).where(GpuSample.period == 0, GpuSample.node == node_name,
                                                      GpuSample.gpu == g)
                              .order_by(GpuSample.at.desc()).limit(1)).first()
        if row is not None:
            out[g] = row
    return out


def _fault(r: GpuReading, before: GpuSample | None) -> str | None:
    if r.xid:
        return f"Xid {r.xid} error"
    if r.ecc_uncorrected > (before.ecc_uncorrected if before is not None else 0):
        return f"{r.ecc_uncorrected} uncorrectable ECC errors"
    return None


def _cordon(session: Session, node: Node, index: int, fault: str, job: Job | None) -> str:
    """The GPU leaves the pool (the scheduler requeues the job on it, which avoids it)."""
    set_gpu_health(node, index, False, f"{fault} at {utcnow():%Y-%m-%d %H:%M} UTC")
    what = f"GPU {index} of node {node.name} reported {fault}: cordoned"
    if job is not None:
        add_event(session, job, "gpu-fault", f"{what}; the job is requeued from its last checkpoint on other GPUs")
        job.avoid = [*(job.avoid or []), [node.name, index]]
    log.warning("%s", what)
    return what


def _idle(session: Session, node_name: str, gpus: list[GpuReading], held: dict, at: float, since_last: float,
          policy: Policy) -> list[str]:
    """A job all of whose GPUs on this node read under the threshold is idle since the first
    such reading; it gets one "idle-gpus" event, in the reading that takes it past
    ``idle_after_s`` (``since_last``: seconds since the node's previous reading)."""
    util = {r.index: r.util for r in gpus}
    by_job: dict[int, list[float]] = defaultdict(list)
    jobs = {}
    for (node, index), job in held.items():
        if node == node_name and index in util:
            by_job[job.id].append(util[index])
            jobs[job.id] = job
    notes = []
    for job_id, values in by_job.items():
        job = jobs[job_id]
        if max(values) >= policy.idle_util:
            job.idle_since = None
            continue
        if job.idle_since is None:
            job.idle_since = datetime.fromtimestamp(at, UTC)
            continue
        idle = at - job.idle_since.timestamp()
        if idle >= policy.idle_after_s and idle - since_last < policy.idle_after_s:
            msg = (f"idle GPUs: its {len(values)} GPUs have been under {policy.idle_util:g}% utilization for "
                   f"{idle / 60:.0f} minutes; stop it if it is stuck, or free the GPUs for others")
            add_event(session, job, "idle-gpus", msg)
            notes.append(f"job {job_id}: {msg}")
    return notes


def holding_handles(session: Session) -> dict[int, dict]:
    """job id -> executor handle of every job holding resources that has been launched."""
    q = select(Job.id, Job.handle).where(Job.state.in_(HOLDING_STATES), Job.handle.is_not(None))
    return {job_id: handle for job_id, handle in session.execute(q)}


def record_jobs(session: Session, used: dict[int, Usage], at: float) -> None:
    """What each job's processes use now (read by the executor, before the transaction)."""
    session.add_all(JobSample(job_id=job_id, at=at, cpu_seconds=u.cpu_seconds, memory_mb=u.memory_mb)
                    for job_id, u in used.items())


def compact(session: Session, now: float, policy: Policy = Policy()) -> tuple[int, int]:
    """Raw samples older than ``raw_keep_s`` become ``rollup_s`` averages (per GPU and job);
    buckets older than ``retention_s`` go. Returns (raw samples rolled up, rows dropped)."""
    cut = now - policy.raw_keep_s
    cut -= cut % policy.rollup_s  # whole buckets only
    rolled = 0
    groups: dict[tuple, list[GpuSample]] = defaultdict(list)
    for s in session.scalars(select(GpuSample).where(GpuSample.period == 0, GpuSample.at < cut)):
        groups[(s.node, s.gpu, s.at - s.at % policy.rollup_s, s.job_id, s.tenant_id)].append(s)
    for (node, gpu, bucket, job_id, tenant_id), rows in groups.items():
        avg = {f: sum(getattr(r, f) for r in rows) / len(rows) for f in GPU_FIELDS}
        session.add(GpuSample(node=node, gpu=gpu, at=bucket, period=policy.rollup_s, job_id=job_id, tenant_id=tenant_id,
                              ecc_uncorrected=max(r.ecc_uncorrected for r in rows), xid=max(r.xid for r in rows),
                              **avg))
        rolled += len(rows)
    hosts: dict[tuple, list[HostSample]] = defaultdict(list)
    for s in session.scalars(select(HostSample).where(HostSample.period == 0, HostSample.at < cut)):
        hosts[(s.node, s.at - s.at % policy.rollup_s)].append(s)
    for (node, bucket), rows in hosts.items():
        session.add(HostSample(node=node, at=bucket, period=policy.rollup_s,
                               **{f: sum(getattr(r, f) for r in rows) / len(rows) for f in HOST_FIELDS}))
    session.execute(delete(GpuSample).where(GpuSample.period == 0, GpuSample.at < cut))
    session.execute(delete(HostSample).where(HostSample.period == 0, HostSample.at < cut))
    old = now - policy.retention_s
    dropped = session.execute(delete(GpuSample).where(GpuSample.at < old)).rowcount
    dropped += session.execute(delete(HostSample).where(HostSample.at < old)).rowcount
    dropped += session.execute(delete(JobSample).where(JobSample.at < old)).rowcount
    return rolled, dropped


# -- reading back --------------------------------------------------------------------------

def latest(session: Session, principal: Principal, within_s: float, now: float) -> list[dict]:
    """Each GPU's newest raw reading (from the last ``within_s`` seconds). Another tenant's
    job on a GPU shows as busy, not as which job."""
    newest = (select(GpuSample.node, GpuSample.gpu, func.max(GpuSample.at).label("at"))
              .where(GpuSample.period == 0, GpuSample.at >= now - within_s)
              .group_by(GpuSample.node, GpuSample.gpu).subquery())
    rows = session.scalars(select(GpuSample).join(
        newest, (GpuSample.node == newest.c.node) & (GpuSample.gpu == newest.c.gpu) & (GpuSample.at == newest.c.at))
        .where(GpuSample.period == 0).order_by(GpuSample.node, GpuSample.gpu))
    out = []
    for s in rows:
        mine = s.job_id is not None and scope.may_see(principal, s)
        out.append({"node": s.node, "gpu": s.gpu, "at": s.at, **{f: getattr(s, f) for f in GPU_FIELDS},
                    "ecc_uncorrected": s.ecc_uncorrected, "xid": s.xid, "job_id": s.job_id if mine else None,
                    "tenant_id": s.tenant_id if mine else None, "busy": s.job_id is not None})
    return out


def hosts(session: Session, within_s: float, now: float) -> list[dict]:
    newest = (select(HostSample.node, func.max(HostSample.at).label("at"))
              .where(HostSample.period == 0, HostSample.at >= now - within_s).group_by(HostSample.node).subquery())
    rows = session.scalars(select(HostSample).join(
        newest, (HostSample.node == newest.c.node) & (HostSample.at == newest.c.at)).where(HostSample.period == 0))
    return [{"node": s.node, "at": s.at, **{f: getattr(s, f) for f in HOST_FIELDS}} for s in rows]


def usage_of(session: Session, job: Job, since: float | None = None, max_points: int = 500,
             processes: bool = True) -> dict:
    """A job's GPU utilization and memory over time (raw and rolled-up samples, newest
    ``max_points`` per GPU), its mean utilization over its last 5 minutes of samples, and what
    its processes used on this machine: CPU in cores (the rate between two samples, at the
    later one) and resident memory, newest ``max_points`` each (``processes``: False, GPUs only).
    ``job``: read by the caller through ``jobs.service.get_job``, which checks it may see it."""
    job_id = job.id
    q = select(GpuSample).where(GpuSample.job_id == job_id)
    if since is not None:
        q = q.where(GpuSample.at >= since)
    series: dict[str, list] = defaultdict(list)
    for s in session.scalars(q.order_by(GpuSample.at)):
        series[f"{s.node}/{s.gpu}"].append([s.at, s.util, s.memory_used_mb])
    last = max((pts[-1][0] for pts in series.values()), default=None)
    recent = [p[1] for pts in series.values() for p in pts if last is not None and p[0] >= last - 300]
    out = {"job_id": job_id, "gpus": {k: v[-max_points:] for k, v in series.items()},
           "mean_util_5m": sum(recent) / len(recent) if recent else None}
    if processes:
        out["cpu"], out["memory_mb"] = _process_series(session, job_id, since, max_points)
    return out


def _process_series(session: Session, job_id: int, since: float | None, max_points: int) -> tuple[list, list]:
    q = select(JobSample.at, JobSample.cpu_seconds, JobSample.memory_mb).where(JobSample.job_id == job_id)
    if since is not None:
        q = q.where(JobSample.at >= since)
    rows = session.execute(q.order_by(JobSample.at.desc()).limit(max_points + 1)).all()[::-1]
    cpu, memory = [], []
    for i, (at, seconds, mb) in enumerate(rows):
        if i:
            before, used = rows[i - 1][0], seconds - rows[i - 1][1]
            if used >= 0 and at > before:  # less than before: the job started again (a new run's processes)
                cpu.append([at, round(used / (at - before), 3)])
        if i or len(rows) <= max_points:
            memory.append([at, round(mb, 1)])
    return cpu, memory


def count_rows(session: Session) -> dict[str, int]:
    return {table.__tablename__: session.scalar(select(func.count()).select_from(table)) or 0
            for table in (GpuSample, HostSample, JobSample)}
