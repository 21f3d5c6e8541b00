"""A job's event log: what happened to it and why, in its own words (``deeppod logs --events``,
the job's page). Written by whoever saw it happen, in that caller's transaction."""

from __future__ import annotations

from sqlalchemy.orm import Session

from deeppod.store.models import Job, JobEvent


def add_event(session: Session, job: Job, kind: str, message: str = "") -> None:
    session.add(JobEvent(job_id=job.id, kind=kind, message=message))
