"""Engines and sessions. SQLite (WAL) is the embedded default; PostgreSQL for production."""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)


def make_engine(url: str, name: str | None = None) -> Engine:
    """``name``: PostgreSQL's application_name for every session (``deeppod-SERVER_ID``: a new
    leader finds a frozen old leader's sessions by it, cluster/leader.py)."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # noqa: ANN001
            cur = dbapi_conn.cursor()
            # WAL lets the API read while the reconcile loop writes.
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20,
                         connect_args={"application_name": name[:63]} if name else {})


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def on_commit_of(sessions: sessionmaker[Session], models: tuple[type, ...], callback) -> None:
    """Call ``callback()`` after a commit that added, changed or deleted a row of ``models``
    (in this process): an idle control loop sleeps until then instead of polling."""
    key = ("deeppod_touched", id(callback))

    @event.listens_for(sessions, "after_flush")
    def _touched(session, _ctx) -> None:  # noqa: ANN001
        if any(isinstance(o, models) for o in (*session.new, *session.dirty, *session.deleted)):
            session.info[key] = True

    @event.listens_for(sessions, "after_commit")
    def _committed(session) -> None:  # noqa: ANN001
        if session.info.pop(key, False):
            callback()

    @event.listens_for(sessions, "after_rollback")
    def _rolled_back(session) -> None:  # noqa: ANN001
        session.info.pop(key, None)
