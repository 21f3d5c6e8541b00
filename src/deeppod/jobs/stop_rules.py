"""Stop rules a user attaches to a job: validated at submit, checked as metrics arrive."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from deeppod.errors import InvalidRequest
from deeppod.store.models import Job, JobMetric

RULE_KINDS = ("nan", "plateau")


def check_rules(rules: list[dict]) -> list[dict]:
    """Validated, normalized copies of the rules."""
    out = []
    for r in rules:
        kind, metric = r.get("kind"), r.get("metric")
        if kind not in RULE_KINDS or not isinstance(metric, str) or not metric:
            raise InvalidRequest(f"stop rule {r!r} is not valid: use {{'kind': 'nan', 'metric': 'loss'}} or "
                                 "{'kind': 'plateau', 'metric': 'val_loss', 'patience': 5, 'mode': 'min'}")
        if kind == "plateau":
            patience, mode = r.get("patience"), r.get("mode", "min")
            if not isinstance(patience, int) or patience < 1 or mode not in ("min", "max"):
                raise InvalidRequest(f"plateau rule on {metric}: patience must be a whole number >= 1 and mode "
                                     "'min' or 'max'")
            out.append({"kind": kind, "metric": metric, "patience": patience, "mode": mode,
                        "min_delta": float(r.get("min_delta", 0.0))})
        else:
            out.append({"kind": kind, "metric": metric})
    return out


def triggered(session: Session, job: Job, touched: set[str]) -> str | None:
    """The reason a rule stops the job, if one does. A few indexed queries per rule, however
    long the run: a plateau compares the last ``patience`` reports with the best before them."""
    for rule in job.stop_rules or []:
        name = rule["metric"]
        if name not in touched:
            continue
        series = select(JobMetric).where(JobMetric.job_id == job.id, JobMetric.name == name)
        if rule["kind"] == "nan":
            bad = session.scalar(select(func.count()).select_from(
                series.where(JobMetric.value.is_(None)).subquery()))
            if bad:
                return f"stop rule: {name} became NaN or infinite"
            continue
        recent = list(session.scalars(series.order_by(JobMetric.step.desc(), JobMetric.id.desc())
                                      .limit(rule["patience"])))
        if len(recent) < rule["patience"]:
            continue
        oldest = recent[-1]
        best = func.min if rule["mode"] == "min" else func.max
        before = session.scalar(select(best(JobMetric.value)).where(
            JobMetric.job_id == job.id, JobMetric.name == name, JobMetric.value.is_not(None),
            (JobMetric.step < oldest.step) | ((JobMetric.step == oldest.step) & (JobMetric.id < oldest.id))))
        if before is None:
            continue
        sign = 1.0 if rule["mode"] == "min" else -1.0
        if not any(r.value is not None and sign * (before - r.value) > rule["min_delta"] for r in recent):
            return (f"stop rule: {name} has not improved for {rule['patience']} reports "
                    f"(best {before:g}, patience {rule['patience']})")
    return None
