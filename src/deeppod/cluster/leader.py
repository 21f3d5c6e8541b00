"""Which server leads a failover control plane: a lease in the database, with a fencing epoch.

Several ``deeppod server`` processes may share one PostgreSQL database. All of them serve the
API; exactly one, the leader, runs the reconcile loop and the executor. The leader holds a
lease (one row, ``leadership``) that it renews every second; a standby takes it over once it
has not been renewed for ``lease_s`` seconds, and every takeover adds one to ``epoch``.

The epoch is the fencing token. Every transaction in which the leader decides (starts,
preempts, requeues) first checks, holding a lock on the lease row, that the row still
names this server, this epoch and an unexpired lease; every executor action checks it again
(executor/fenced.py). An old leader that was paused or cut off and comes back finds another
epoch there and stops: it cannot start a job twice or act on a job the new leader owns. The
lock means a takeover waits for a decision being written to commit, so the new leader sees
every job its predecessor started; a leader frozen while it holds one has its database
sessions ended once its lease is over. A failover control plane needs PostgreSQL.

On SQLite (one server: server.serve holds a lock on the database file) the server takes the
lease as it joins and keeps it for as long as it runs (``solo``): no renewal, so no load can
make it lose the lead to itself.

Times are the database's clock (never this machine's), so servers whose clocks disagree
still agree on who leads.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid

from sqlalchemy import delete, func, literal, select, text, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from deeppod.errors import NotLeader
from deeppod.store.db import read_only
from deeppod.store.models import LeaderLease, Server

log = logging.getLogger(__name__)

LEASE_S = 5.0  # a leader that stops renewing is replaced this long after its last renewal
RENEW_S = 1.0  # how often the lease and each server's heartbeat are renewed
GONE_S = 3 * LEASE_S  # a server not heard from this long is dead: its unfinished work is undone
FORGET_S = 3600.0  # a dead server's row is dropped after this long
LEASE_ROW = 1
SOLO_EXPIRES = 1e15  # a solo server's lease: never renewed, given up as it stops


def session_name(server_id: str) -> str:
    """PostgreSQL's application_name: how a new leader finds a frozen old leader's sessions."""
    return f"deeppod-{server_id}"


def _clock(session: Session):
    """The database's clock in seconds since the epoch, as a SQL expression evaluated when the
    statement runs (PostgreSQL: clock_timestamp, not the transaction's start)."""
    if session.get_bind().dialect.name == "postgresql":
        return func.extract("epoch", func.clock_timestamp())
    return (func.julianday("now") - literal(2440587.5)) * literal(86400.0)


def db_now(session: Session) -> float:
    return float(session.scalar(select(_clock(session))))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def live_servers(session: Session) -> list[Server]:
    """The servers heard from in the last GONE_S seconds, oldest first."""
    return list(session.scalars(select(Server).where(Server.seen_at >= _clock(session) - GONE_S)  # one statement
                                .order_by(Server.started_at)))


def leader_row(session: Session) -> LeaderLease | None:
    return session.get(LeaderLease, LEASE_ROW)


class Leadership:
    """This server's membership and its claim on the lease. ``heartbeat()`` is called every
    RENEW_S seconds by one thread; ``fence(session)`` inside every deciding transaction."""

    def __init__(self, sessions: sessionmaker[Session], url: str, *, lease_s: float = LEASE_S,
                 server_id: str | None = None, solo: bool = False):
        """``sessions``: on PostgreSQL, of an engine of the lease's own, so that the API's load
        cannot keep a renewal waiting for a connection. ``solo``: the only server of its
        database; it leads without a lease."""
        self.sessions = sessions
        self._reads = read_only(sessions)
        self.solo = solo
        self.url = url
        self.lease_s = lease_s
        self.id = server_id or uuid.uuid4().hex
        self.epoch: int | None = None  # while leading: the epoch this server took the lease at
        self.live_urls: list[str] = [url]  # while leading: every live server's URL, as of the last heartbeat
        self._on_postgresql = sessions.kw["bind"].dialect.name == "postgresql"

    @property
    def leading(self) -> bool:
        return self.epoch is not None

    def join(self) -> None:
        """Record this server and make sure the lease row exists (free: expired at 0). A
        server of this machine whose process is gone (this one, before a crash) is forgotten
        and its lease freed at once: a restarted server need not wait for it to expire."""
        host = socket.gethostname()
        with self.sessions.begin() as s:
            for dead in [sv for sv in s.scalars(select(Server).where(Server.host == host)) if not _alive(sv.pid)]:
                log.info("server %s (pid %s on this machine) is gone: its lease is freed", dead.url, dead.pid)
                s.execute(update(LeaderLease).where(LeaderLease.server_id == dead.id).values(expires_at=0.0))
                s.delete(dead)
            self._add_row(s)
        try:
            with self.sessions.begin() as s:
                if leader_row(s) is None:
                    s.add(LeaderLease(id=LEASE_ROW, server_id=None, url="", epoch=0, expires_at=0.0))
        except IntegrityError:  # another server made it at the same moment
            pass
        if self.solo:  # the only server of its database (the caller holds the kernel's word on it)
            with self.sessions.begin() as s:
                s.execute(update(LeaderLease).where(LeaderLease.id == LEASE_ROW).values(
                    server_id=self.id, url=self.url, epoch=LeaderLease.epoch + 1, expires_at=SOLO_EXPIRES))
                self.epoch = int(s.scalar(select(LeaderLease.epoch).where(LeaderLease.id == LEASE_ROW)))
            log.info("this server leads (epoch %s), the only server of its database", self.epoch)

    def _add_row(self, s: Session) -> None:
        now = db_now(s)
        s.add(Server(id=self.id, url=self.url, host=socket.gethostname(), pid=os.getpid(), started_at=now,
                     seen_at=now))

    def _mine(self):
        """The lease row while it names this server at its epoch."""
        return update(LeaderLease).where(LeaderLease.id == LEASE_ROW, LeaderLease.server_id == self.id,
                                         LeaderLease.epoch == self.epoch)

    def heartbeat(self) -> bool:
        """Say this server is alive; renew the lease if it leads, else take it if it has
        expired. Returns whether this server leads now. A database error counts as a lost lease
        (a solo server's is only logged: nothing can take its place)."""
        if self.solo:
            try:
                with self.sessions.begin() as s:
                    if not s.execute(update(Server).where(Server.id == self.id).values(seen_at=_clock(s))).rowcount:
                        self._add_row(s)
            except Exception:
                log.exception("heartbeat failed (this server leads alone; it goes on)")
            return self.epoch is not None
        try:
            with self.sessions.begin() as s:
                seen = s.execute(update(Server).where(Server.id == self.id).values(seen_at=_clock(s))).rowcount
                if not seen:  # dropped as dead after a long pause: join again
                    self._add_row(s)
                if self.epoch is not None:  # the leader renews in the same commit (one a second)
                    renewed = s.execute(self._mine().values(expires_at=_clock(s) + self.lease_s)).rowcount
                    if not renewed:
                        log.warning("lost the lead (epoch %s): another server leads now", self.epoch)
                        self.epoch = None
                    else:  # and reads who else is alive, for jobs' API URLs, in the same transaction
                        self.live_urls = [sv.url for sv in live_servers(s)]
                    return self.epoch is not None
            with self.sessions.begin() as s:
                if self.epoch is not None:
                    renewed = s.execute(self._mine().values(expires_at=_clock(s) + self.lease_s)).rowcount
                    if not renewed:
                        log.warning("lost the lead (epoch %s): another server leads now", self.epoch)
                        self.epoch = None
                    return self.epoch is not None
                if not self._lockable(s):
                    return False
                taken = s.execute(update(LeaderLease).where(
                    LeaderLease.id == LEASE_ROW, LeaderLease.expires_at < _clock(s),
                ).values(server_id=self.id, url=self.url, epoch=LeaderLease.epoch + 1,
                         expires_at=_clock(s) + self.lease_s)).rowcount
                if taken:
                    self.epoch = int(s.scalar(select(LeaderLease.epoch).where(LeaderLease.id == LEASE_ROW)))
                    self.live_urls = [sv.url for sv in live_servers(s)]
                    log.info("this server leads now (epoch %s)", self.epoch)
                return self.epoch is not None
        except Exception:  # a database that does not answer: this server cannot prove it leads
            if self.epoch is not None:
                log.exception("could not renew the lead (epoch %s): stepping down", self.epoch)
            else:
                log.exception("heartbeat failed")
            self.epoch = None
            return False

    def _lockable(self, s: Session) -> bool:
        """PostgreSQL, before a takeover: lock the lease row, waiting at most a second. Deciding
        transactions hold a key-share lock on it, so a takeover waits for them to commit. A
        leader frozen in the middle of one (a paused VM, a cut link) would hold it forever: once
        its lease has expired, its database sessions are ended (the transaction is rolled back,
        nothing it decided lands) and the next heartbeat takes over."""
        if not self._on_postgresql:
            return True
        s.execute(text("SET LOCAL lock_timeout = '1s'"))
        try:
            with s.begin_nested():
                s.execute(select(LeaderLease.id).where(LeaderLease.id == LEASE_ROW).with_for_update())
            return True
        except OperationalError:
            ended = s.execute(text(
                "SELECT count(pg_terminate_backend(a.pid)) FROM pg_stat_activity a JOIN leadership l "
                "ON a.application_name = :prefix || l.server_id "
                "WHERE l.id = :row AND l.expires_at < extract(epoch from clock_timestamp()) "
                "AND a.datname = current_database() AND a.pid <> pg_backend_pid()"),
                {"row": LEASE_ROW, "prefix": session_name("")}).scalar()
            if ended:
                log.warning("the old leader's lease expired while it held a decision open: ended its %d database "
                            "sessions", ended)
            return False

    def fence(self, session: Session) -> None:
        """Raise NotLeader unless the lease row names this server at its epoch, unexpired; the row
        stays locked until the transaction ends, so no takeover slips in before its decisions
        commit."""
        if not self._holds(session, lock=True):
            raise NotLeader(f"this server does not lead (epoch {self.epoch}); the leader is "
                            f"{leader_url(session) or 'being chosen'}")

    def check(self) -> None:
        """``fence`` in a short transaction of its own and without a lock: before an executor
        action (a lock here could wait behind a renewal that waits for the caller's lock)."""
        with self._reads() as s:
            if not self._holds(s, lock=False):
                raise NotLeader(f"this server does not lead (epoch {self.epoch}): the executor action is refused")

    def _holds(self, session: Session, *, lock: bool) -> bool:
        epoch = self.epoch
        q = select(LeaderLease.server_id, LeaderLease.epoch, LeaderLease.expires_at > _clock(session)).where(
            LeaderLease.id == LEASE_ROW)
        if lock and self._on_postgresql:  # key share: the leader's own renewals do not wait for it
            q = q.with_for_update(read=True, key_share=True)
        elif lock:  # SQLite: a no-op write takes the database's write lock until the transaction ends
            session.execute(update(LeaderLease).where(LeaderLease.id == LEASE_ROW).values(epoch=LeaderLease.epoch))
        row = session.execute(q).first()
        return epoch is not None and row is not None and tuple(row) == (self.id, epoch, True)

    def release(self) -> None:
        """At a clean shutdown: give the lease up at once (a standby need not wait for it to
        expire) and leave the list of servers."""
        try:
            with self.sessions.begin() as s:
                if self.epoch is not None:
                    s.execute(self._mine().values(expires_at=0.0))
                s.execute(delete(Server).where(Server.id == self.id))
        except Exception:  # the lease then expires by itself
            log.exception("could not release the lead")
        self.epoch = None

    def live_ids(self) -> set[str]:
        """The servers alive now, this one always among them (its ingests are under way)."""
        with self.sessions() as s:
            return {sv.id for sv in live_servers(s)} | {self.id}

    def forget_dead(self) -> int:
        with self.sessions.begin() as s:
            return s.execute(delete(Server).where(Server.seen_at < db_now(s) - FORGET_S)).rowcount


def list_servers(session: Session) -> list[dict]:
    """Every server recorded, newest heartbeat first: whether it is live, and which leads."""
    now = db_now(session)
    lease = leader_row(session)
    leading = lease.server_id if lease is not None and lease.expires_at > now else None
    return [{"id": sv.id, "url": sv.url, "host": sv.host, "pid": sv.pid, "up_s": round(now - sv.started_at, 1),
             "seen_s_ago": round(now - sv.seen_at, 1), "live": now - sv.seen_at <= GONE_S,
             "leader": sv.id == leading, "epoch": lease.epoch if sv.id == leading else None}
            for sv in session.scalars(select(Server).order_by(Server.seen_at.desc()))]


def leader_url(session: Session) -> str | None:
    row = session.execute(select(LeaderLease.url, LeaderLease.expires_at > _clock(session)).where(
        LeaderLease.id == LEASE_ROW)).first()
    return row[0] if row is not None and row[1] and row[0] else None


def api_urls(session: Session, first: str) -> str:
    """DEEPPOD_API_URL for a job: every live server, the leader's first, so it outlives a failover."""
    return urls_first(first, [s.url for s in live_servers(session)])


def urls_first(first: str, urls: list[str]) -> str:
    return ",".join([first] + [u for u in urls if u != first])
