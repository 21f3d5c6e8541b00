"""Engines and sessions. SQLite (WAL) is the embedded default; PostgreSQL for production.

SQLite takes one writer at a time, and a transaction that read first and then writes after
another connection committed cannot write at all (its snapshot is stale: SQLite answers
"database is locked" at once, whatever the busy timeout). So on SQLite every transaction
that may write starts with ``BEGIN IMMEDIATE`` (the write lock from its first statement),
and the writers of this process take turns on one lock first, instead of spinning in
SQLite's busy handler. Reads that cannot write (GET requests: :func:`read_only`) begin
deferred and run beside the writer, as WAL allows. A read-only session that tries to write
is refused with a clear error.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from deeppod.errors import Busy, DatabaseMisuse

log = logging.getLogger(__name__)

SQLITE_POOL = 32  # connections are cheap: kept open (each new one costs its PRAGMAs)
PG_POOL, PG_OVERFLOW = 10, 20
POOL_TIMEOUT_S = 10.0  # a request that still waits this long for a connection fails (admission keeps it rare)
READ_ONLY = "deeppod_read_only"
WRITER_WAIT_S = 30.0  # as SQLite's busy timeout: a writer waiting longer is an error, never a hang
# (a transaction that begins writing while its own thread's other one holds the turn waits this
# long, then fails with both threads named in the log: a bug to fix, never a silent hang)


def make_engine(url: str, name: str | None = None, *, pool_size: int | None = None) -> Engine:
    """``name``: PostgreSQL's application_name for every session (``deeppod-SERVER_ID``: a new
    leader finds a frozen old leader's sessions by it, cluster/leader.py). ``pool_size``: its
    own pool's (the lease's engine has a small one of its own)."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": WRITER_WAIT_S},
                               pool_size=pool_size or SQLITE_POOL, max_overflow=0, pool_timeout=POOL_TIMEOUT_S)
        _one_writer(engine)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=pool_size or PG_POOL,
                         max_overflow=PG_OVERFLOW if pool_size is None else 0, pool_timeout=POOL_TIMEOUT_S,
                         connect_args={"application_name": name[:63]} if name else {})


def pool_capacity(engine: Engine) -> int:
    """How many connections its pool gives out at once."""
    pool = engine.pool
    size = pool.size() if hasattr(pool, "size") else 1
    return size + max(0, getattr(pool, "_max_overflow", 0))


def _one_writer(engine: Engine) -> None:
    turn = threading.Lock()  # this process's writers, one at a time
    holder: list[tuple[str, int]] = []  # the thread that began the transaction holding it (for the error)

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn, _record):  # noqa: ANN001
        dbapi_conn.isolation_level = None  # the driver begins nothing itself: _begin does
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")  # the API reads while the reconcile loop writes
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={int(WRITER_WAIT_S * 1000)}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn) -> None:  # noqa: ANN001
        if conn.get_execution_options().get(READ_ONLY):
            conn.exec_driver_sql("BEGIN")
            return
        if asyncio._get_running_loop() is not None:  # the whole server would stop while it waits its turn
            raise DatabaseMisuse("a transaction that may write began on the event loop: run it in the thread pool "
                                 "(run_in_threadpool), or read with read_only sessions")
        if not turn.acquire(timeout=WRITER_WAIT_S):  # a writer this slow is a bug (one waiting on itself) or a jam
            log.error("waited %.0f s for the database's writer; the holder: %s", WRITER_WAIT_S, _where(holder),
                      stack_info=True)
            raise Busy(f"the database stayed busy for {WRITER_WAIT_S:g} s: try again")
        conn.info["deeppod_turn"] = True
        holder[:] = [(threading.current_thread().name, threading.get_ident())]
        try:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        except BaseException:
            _done(conn)
            raise

    def _done(conn) -> None:  # noqa: ANN001
        info = conn if isinstance(conn, dict) else conn.info
        if info.pop("deeppod_turn", False):
            holder.clear()
            turn.release()

    # after the transaction: its COMMIT or ROLLBACK is the next statement, and the next writer's
    # BEGIN IMMEDIATE waits for it in SQLite (microseconds)
    event.listen(engine, "commit", _done)
    event.listen(engine, "rollback", _done)

    @event.listens_for(engine.pool, "checkin")
    def _returned(_dbapi_conn, record) -> None:  # noqa: ANN001
        _done(record.info)  # a connection given back without its transaction ended (an error)


def _where(holder: list[tuple[str, int]]) -> str:
    """The holding thread's name and where it is now (its stack, read only when a writer gave up)."""
    if not holder:
        return "none (it was just let go)"
    name, ident = holder[0]
    frame = sys._current_frames().get(ident)
    return f"{name}, now at:\n" + ("".join(traceback.format_stack(frame)) if frame is not None else "(it has ended)")


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def read_only(sessions: sessionmaker[Session]) -> sessionmaker[Session]:
    """Sessions for what only reads (GET requests); one that tries to write is refused (a bug,
    said clearly). On SQLite they begin deferred and run beside the writer. On PostgreSQL
    each statement is its own transaction (autocommit): no BEGIN before the first and no
    ROLLBACK to give the connection back, two round trips a request saved, and closing one
    sends nothing, so it may close on the event loop."""
    engine = sessions.kw["bind"]
    if engine.dialect.name == "sqlite":
        engine = engine.execution_options(**{READ_ONLY: True})
    else:
        engine = engine.execution_options(isolation_level="AUTOCOMMIT")
    reader = sessionmaker(engine, expire_on_commit=False)

    @event.listens_for(reader, "before_flush")
    def _refuse(session, _ctx, _instances) -> None:  # noqa: ANN001
        if session.new or session.dirty or session.deleted:
            raise DatabaseMisuse("a read-only session (a GET request's) tried to write to the database")

    return reader


def on_commit_of(sessions: sessionmaker[Session], models: tuple[type, ...], callback,
                 which: Callable[[object], bool] | None = None, added_only: bool = False) -> None:
    """Call ``callback()`` after a commit that added, changed or deleted a row of ``models``
    (in this process): an idle control loop sleeps until then instead of polling. ``which``
    narrows it to the rows it says yes to (it may read their attributes' history);
    ``added_only`` to rows added."""
    key = ("deeppod_touched", id(callback))

    @event.listens_for(sessions, "after_flush")
    def _touched(session, _ctx) -> None:  # noqa: ANN001
        rows = session.new if added_only else (*session.new, *session.dirty, *session.deleted)
        if any(isinstance(o, models) and (which is None or which(o)) for o in rows):
            session.info[key] = True

    @event.listens_for(sessions, "after_commit")
    def _committed(session) -> None:  # noqa: ANN001
        if session.info.pop(key, False):
            callback()

    @event.listens_for(sessions, "after_rollback")
    def _rolled_back(session) -> None:  # noqa: ANN001
        session.info.pop(key, None)
