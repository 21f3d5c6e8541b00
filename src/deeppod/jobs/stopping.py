"""A graceful stop asked for a running job, whoever asks: a user (``deeppod stop``), its stop
rules, its tenant's storage quota, its search's pruner, its time limit. The reason is written
once here; the controller then sends its workers SIGTERM, waits its grace, sends SIGKILL, and
the run ends as ``stop_as`` says (``stopped``, resumable, when none)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from deeppod.contract import JobState
from deeppod.store.events import add_event
from deeppod.store.models import Job, utcnow


def request_stop(s: Session, job: Job, why: str, *, stop_as: JobState | None = None,
                 event: str = "stop-requested", told: str = "") -> None:
    """Mark ``job`` to be stopped for ``why`` (its reason once it ends) and say so in its events:
    ``told`` is the event's first words where they differ from the reason."""
    job.stop_reason, job.stop_as = why, stop_as.value if stop_as else None
    job.stop_requested_at = job.stop_requested_at or utcnow()
    add_event(s, job, event, f"{told or why}; workers get SIGTERM, {job.grace_seconds:g} s to checkpoint, "
                             "then SIGKILL")
