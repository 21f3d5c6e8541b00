"""Training metrics and histograms of jobs: ingest (checking stop rules), read back
downsampled for tables, sparklines and the UI's charts."""

from __future__ import annotations

import math
from collections import defaultdict

from sqlalchemy import select
from sqlalchemy.orm import Session

from deeppod.auth.service import Principal
from deeppod.contract import JobState
from deeppod.errors import InvalidRequest
from deeppod.jobs.service import add_event, get_job
from deeppod.jobs.stop_rules import triggered
from deeppod.store.models import JobHistogram, JobMetric


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
    job = get_job(session, principal, job_id)
    stored = 0
    touched: set[str] = set()
    for p in points:
        step = p.get("step")
        if not isinstance(step, int) or step < 0:
            raise InvalidRequest(f"every point needs a whole-number step >= 0 (got {step!r})")
        for name, value in (p.get("metrics") or {}).items():
            session.add(JobMetric(job_id=job.id, name=str(name)[:128], step=step, value=_number(value)))
            touched.add(str(name)[:128])
            stored += 1
        for name, h in (p.get("histograms") or {}).items():
            counts = h.get("counts")
            if not isinstance(counts, list) or not all(isinstance(c, int) for c in counts) or len(counts) > 1000:
                raise InvalidRequest(f"histogram {name!r} needs 'counts': a list of at most 1000 whole numbers")
            session.add(JobHistogram(job_id=job.id, name=str(name)[:256], step=step, min=float(h.get("min", 0.0)),
                                     max=float(h.get("max", 0.0)), counts=counts))
            stored += 1
    session.flush()
    if job.stop_reason is None and job.state in (JobState.RUNNING, JobState.QUEUED):
        reason = triggered(session, job, touched)
        if reason:
            job.stop_reason = reason
            add_event(session, job, "stop-requested", f"{reason}; workers get SIGTERM and keep their checkpoint")
    return stored


def series(session: Session, principal: Principal, job_id: int, names: list[str] | None = None,
           max_points: int = 500) -> dict:
    """Each metric's (step, value) points; longer series are averaged into ``max_points``
    buckets of steps (the last point is always kept exactly)."""
    get_job(session, principal, job_id)
    if not 2 <= max_points <= 100_000:
        raise InvalidRequest("max_points must be between 2 and 100000")
    q = select(JobMetric.name, JobMetric.step, JobMetric.value).where(JobMetric.job_id == job_id)
    if names:
        q = q.where(JobMetric.name.in_(names))
    raw: dict[str, list[tuple[int, float | None]]] = defaultdict(list)
    for name, step, value in session.execute(q.order_by(JobMetric.name, JobMetric.step, JobMetric.id)):
        raw[name].append((step, value))
    out = {}
    for name, pts in raw.items():
        out[name] = {"points": len(pts), "last": [pts[-1][0], pts[-1][1]], "series": _downsample(pts, max_points)}
    return {"job_id": job_id, "metrics": out}


def _downsample(pts: list[tuple[int, float | None]], n: int) -> list[list]:
    if len(pts) <= n:
        return [[s, v] for s, v in pts]
    lo, hi = pts[0][0], pts[-1][0]
    width = max(1.0, (hi - lo + 1) / (n - 1))
    buckets: dict[int, list] = defaultdict(list)
    for s, v in pts[:-1]:
        buckets[int((s - lo) // width)].append((s, v))
    out = []
    for _, b in sorted(buckets.items()):
        finite = [v for _, v in b if v is not None]
        out.append([b[-1][0], sum(finite) / len(finite) if finite else None])
    out.append([pts[-1][0], pts[-1][1]])
    return out


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
