"""Training metrics and histograms of jobs: ingest (checking stop rules), read back
downsampled for tables, sparklines and the UI's charts."""

from __future__ import annotations

import json
import math
import os
from collections import Counter, defaultdict
from pathlib import Path

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from deeppod import nofollow
from deeppod.auth.service import Principal
from deeppod.contract import METRICS_SPOOL, JobState
from deeppod.errors import InvalidRequest
from deeppod.jobs.service import add_event, get_job
from deeppod.jobs.stop_rules import triggered
from deeppod.jobs.stopping import request_stop
from deeppod.store.models import Job, JobHistogram, JobMetric, Trial

SPOOL_MAX_BYTES = 64 << 20  # of a job's unsent points (a process keeps at most 100,000)


def _number(v) -> float | None:
    if isinstance(v, bool):
        raise InvalidRequest("metric values must be numbers")
    if isinstance(v, (int, float)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, str) and v.lower() in ("nan", "inf", "-inf", "infinity", "-infinity"):
        return None
    raise InvalidRequest(f"metric value {v!r} is not a number")


def ingest(session: Session, principal: Principal, job_id: int, points: list[dict]) -> int:
    """Store a batch of points; evaluate the job's stop rules. Returns how many values were stored."""
    return _store(session, get_job(session, principal, job_id), points)


def _check(p) -> None:
    """InvalidRequest, saying what to fix, unless ``p`` has the shape of a point as
    runtime/metrics.py sends it (its metric values are checked as they are stored: ``_number``)."""
    if not isinstance(p, dict):
        raise InvalidRequest("every point is an object with a step and metrics or histograms")
    step = p.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise InvalidRequest(f"every point needs a whole-number step >= 0 (got {step!r})")
    trial = p.get("trial")  # a search's process that runs trial after trial says which
    if trial is not None and (not isinstance(trial, int) or isinstance(trial, bool) or trial < 0):
        raise InvalidRequest(f"a point's trial must be a whole number >= 0 (got {trial!r})")
    for name, h in (p.get("histograms") or {}).items():
        counts = h.get("counts") if isinstance(h, dict) else None
        if not isinstance(counts, list) or not all(isinstance(c, int) for c in counts) or len(counts) > 1000:
            raise InvalidRequest(f"histogram {name!r} needs 'counts': a list of at most 1000 whole numbers")


def _store(session: Session, job, points: list[dict]) -> int:
    stored = 0
    touched: set[str] = set()
    rows: list[JobMetric] = []
    for p in points:
        _check(p)
        step, trial = p["step"], p.get("trial")
        for name, value in (p.get("metrics") or {}).items():
            rows.append(JobMetric(job_id=job.id, name=str(name)[:128], step=step, value=_number(value), trial=trial))
            touched.add(str(name)[:128])
            stored += 1
        for name, h in (p.get("histograms") or {}).items():
            session.add(JobHistogram(job_id=job.id, name=str(name)[:256], step=step, min=float(h.get("min", 0.0)),
                                     max=float(h.get("max", 0.0)), counts=h["counts"]))
            stored += 1
    _supersede(session, job.id, rows)
    session.add_all(rows)
    session.flush()
    if job.stop_reason is None and job.state in (JobState.RUNNING, JobState.QUEUED):
        reason = triggered(session, job, touched)
        if reason:
            request_stop(session, job, reason)
    return stored


def take_spool(session: Session, job, checkpoints: Path) -> int:
    """The points the job's processes could not send before they exited (runtime/metrics.py
    keeps them in its checkpoint folder when the control plane is away): stored as if sent,
    with an event, and the file removed. Read with no link followed (the folder is the job's);
    a line that is not a valid point is left out and counted. Returns the values stored."""
    try:
        dir_fd = nofollow.open_dir(checkpoints)
    except OSError:
        return 0
    try:
        fd, _ = nofollow.open_regular(dir_fd, METRICS_SPOOL)
    except OSError:  # none (the usual case), or not a regular file: nothing to take
        os.close(dir_fd)
        return 0
    try:
        with os.fdopen(fd, "rb") as f:
            data = f.read(SPOOL_MAX_BYTES + 1)
        os.unlink(METRICS_SPOOL, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    points, bad = [], 0
    for line in data[:SPOOL_MAX_BYTES].splitlines():
        try:
            p = json.loads(line)
            _check(p)
            for value in (p.get("metrics") or {}).values():
                _number(value)  # a bad value here would refuse the whole file's points in _store
        except (ValueError, InvalidRequest, AttributeError, TypeError):
            bad += 1
            continue
        points.append(p)
    stored = _store(session, job, points) if points else 0
    cut = f" (its first {SPOOL_MAX_BYTES >> 20} MiB)" if len(data) > SPOOL_MAX_BYTES else ""
    add_event(session, job, "metrics", f"{len(points)} metric points its processes could not send before they "
                                       f"exited were taken from its folder{cut}"
                                       + (f"; {bad} lines that were not points left out" if bad else ""))
    return stored


def _supersede(session: Session, job_id: int, rows: list[JobMetric]) -> None:
    """A run that resumed from a checkpoint reports its steps again: from the first step it
    reports, its values replace the earlier run's (whose work since then was lost), so a series
    is one timeline, never a line going back in steps or two runs' values at one step."""
    first: dict[tuple[str, int | None], int] = {}  # a reused process's trials are each a series of its own
    for r in rows:
        first[r.name, r.trial] = min(r.step, first.get((r.name, r.trial), r.step))
    if not first:
        return
    stored = session.execute(select(JobMetric.name, JobMetric.trial, func.max(JobMetric.step))
                             .where(JobMetric.job_id == job_id, JobMetric.name.in_({n for n, _ in first}))
                             .group_by(JobMetric.name, JobMetric.trial)).all()
    for name, trial, top in stored:
        if (name, trial) in first and top >= first[name, trial]:  # only after a restart (or a step reported twice)
            session.execute(delete(JobMetric).where(JobMetric.job_id == job_id, JobMetric.name == name,
                                                    JobMetric.trial.is_(None) if trial is None
                                                    else JobMetric.trial == trial,
                                                    JobMetric.step >= first[name, trial]))


def series(session: Session, principal: Principal, job_id: int, names: list[str] | None = None,
           max_points: int = 500, with_time: bool = False) -> dict:
    """Each metric's points, averaged by the database into at most ``max_points`` step buckets."""
    return job_series(session, get_job(session, principal, job_id), names, max_points, with_time)


def job_series(session: Session, job: Job, names: list[str] | None = None, max_points: int = 500,
               with_time: bool = False) -> dict:
    """``series`` of a job the caller has already read (and so may see)."""
    job_id = job.id
    if not 2 <= max_points <= 100_000:
        raise InvalidRequest("max_points must be between 2 and 100000")
    trial = _shown_trial(session, job)
    scope = [JobMetric.job_id == job_id, *([JobMetric.trial == trial] if trial is not None else [])]
    mine = [*scope, *([JobMetric.name.in_(names)] if names else [])]
    shapes = session.execute(select(JobMetric.name, func.count(), func.min(JobMetric.step), func.max(JobMetric.step))
                             .where(*mine).group_by(JobMetric.name).order_by(JobMetric.name))
    first = session.scalar(select(func.min(JobMetric.at)).where(*scope)) if with_time else None
    out = {}
    for name, count, lo, hi in shapes.all():
        last, pts = _points(session, scope, name, count, lo, hi, max_points, first)
        out[name] = {"points": count, "last": last, "series": pts}
    return {"job_id": job_id, "metrics": out, **({"trial": trial} if trial is not None else {})}


def trial_series(session: Session, trials: list[tuple[int, int]], name: str, max_points: int = 300) -> dict:
    """Metric ``name`` of each of a search's trials ``(number, job_id)`` (the caller has read
    the search: these are its trials' jobs), at most ``max_points`` points each: {number: points}.
    A process that ran several trials (--reuse) holds a series per trial, told apart by number."""
    hosts = Counter(job_id for _, job_id in trials)
    out = {}
    for number, job_id in trials:
        scope = [JobMetric.job_id == job_id, *([JobMetric.trial == number] if hosts[job_id] > 1 else [])]
        count, lo, hi = session.execute(select(func.count(), func.min(JobMetric.step), func.max(JobMetric.step))
                                        .where(*scope, JobMetric.name == name)).one()
        if count:
            out[number] = _points(session, scope, name, count, lo, hi, max_points)[1]
    return out


def _points(session: Session, scope: list, name: str, count: int, lo: int, hi: int,
            max_points: int, first=None) -> tuple[list, list[list]]:
    """(the last point, the series of at most ``max_points`` points); each point with its
    seconds since ``first`` too where that is given."""
    when = [JobMetric.at] if first is not None else []
    last = session.execute(select(JobMetric.step, JobMetric.value, *when)
                           .where(*scope, JobMetric.name == name, JobMetric.step == hi)
                           .order_by(JobMetric.id.desc()).limit(1)).one()
    if count <= max_points:
        rows = session.execute(select(JobMetric.step, JobMetric.value, *when).where(*scope, JobMetric.name == name)
                               .order_by(JobMetric.step, JobMetric.id)).all()
    else:
        rows = _buckets(session, scope, name, lo, hi, max_points - 1, bool(when)) + [last]
    if first is None:
        return [last[0], last[1]], [[r[0], r[1]] for r in rows]
    return [last[0], last[1]], [[r[0], r[1], round((r[2] - first).total_seconds(), 3)] for r in rows]


def _shown_trial(session: Session, job) -> int | None:
    """A search's process that ran several trials (--reuse) holds a series per trial: its
    latest trial's is the one shown. None for every other job (all its points are one series)."""
    if job.kind != "trial" or (session.scalar(select(func.count()).select_from(Trial)
                                              .where(Trial.job_id == job.id)) or 0) < 2:
        return None
    return session.scalar(select(func.max(JobMetric.trial)).where(JobMetric.job_id == job.id))


def _buckets(session: Session, scope: list, name: str, lo: int, hi: int, n: int, with_time: bool = False) -> list:
    """The points before the last step in ``n`` equal step ranges: each range's last step and
    mean value, and its last time with ``with_time`` (integer division: the same buckets on
    SQLite and PostgreSQL)."""
    span = max(1, hi - lo)
    bucket = ((JobMetric.step - lo) * n).op("/")(span)  # SQL's integer division on both databases
    when = [func.max(JobMetric.at)] if with_time else []
    rows = session.execute(select(func.max(JobMetric.step), func.avg(JobMetric.value), *when)
                           .where(*scope, JobMetric.name == name, JobMetric.step < hi)
                           .group_by(bucket).order_by(bucket))
    return [(r[0], None if r[1] is None else float(r[1]), *r[2:]) for r in rows]


def histograms(session: Session, principal: Principal, job_id: int, name: str | None = None,
               max_steps: int = 50) -> list[dict]:
    """Histograms, newest ``max_steps`` steps per name, oldest first."""
    get_job(session, principal, job_id)
    q = select(JobHistogram).where(JobHistogram.job_id == job_id)
    if name:
        q = q.where(JobHistogram.name == name)
    rows = list(session.scalars(q.order_by(JobHistogram.name, JobHistogram.step)))
    by: dict[str, list] = defaultdict(list)
    for h in rows:
        by[h.name].append({"name": h.name, "step": h.step, "min": h.min, "max": h.max, "counts": h.counts})
    return [h for hs in by.values() for h in hs[-max_steps:]]
