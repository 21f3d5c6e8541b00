"""The leader's lease and its fencing epoch, on SQLite and PostgreSQL, with two (or three)
servers' claims on one database and the fake executor."""

import subprocess
import sys
import threading
import time

import pytest
from sqlalchemy import select, update
from sqlalchemy.exc import OperationalError

from deeppod.cluster.leader import GONE_S, Leadership, api_urls, leader_url, live_servers, session_name
from deeppod.errors import NotLeader
from deeppod.executor.fake import FakeExecutor
from deeppod.executor.fenced import FencedExecutor
from deeppod.jobs.controller import JobController
from deeppod.store.models import LeaderLease, Server
from tests.fixtures import load_job, populate, submit_job
from tests.helpers import wait_until

LEASE = 0.6  # short, so an expiry takes a moment here (only where a test waits for one by the clock)
LONG = 60.0  # elsewhere: a loaded machine may take longer than LEASE between two steps; expire() ends it


def expire(sessions) -> None:
    """The leader's lease runs out now (as if it had not renewed for its whole lease), whatever
    the machine's speed: the tests that need an expiry in the middle of something make it so."""
    with sessions.begin() as s:
        s.execute(update(LeaderLease).where(LeaderLease.id == 1).values(expires_at=0.0))


def claim(sessions, url, lease_s=LONG) -> Leadership:
    lead = Leadership(sessions, url, lease_s=lease_s)
    lead.join()
    return lead


def test_one_leads_the_other_waits(sessions):
    a, b = claim(sessions, "http://a:1"), claim(sessions, "http://b:1")
    assert a.heartbeat() and a.epoch == 1
    assert not b.heartbeat() and b.epoch is None
    assert a.heartbeat() and a.epoch == 1  # a renewal keeps the epoch
    with sessions.begin() as s:
        a.fence(s)
        with pytest.raises(NotLeader, match="the leader is http://a:1"):
            b.fence(s)
        assert leader_url(s) == "http://a:1"
        assert [sv.url for sv in live_servers(s)] == ["http://a:1", "http://b:1"]
        assert api_urls(s, "http://a:1") == "http://a:1,http://b:1"
    assert a.live_urls == ["http://a:1", "http://b:1"]  # read by the leader's heartbeat, for jobs' URLs
    c = claim(sessions, "http://c:1")
    assert a.heartbeat() and a.live_urls == ["http://a:1", "http://b:1", "http://c:1"]  # one beat later
    assert not c.heartbeat()
    a.check()
    with pytest.raises(NotLeader):
        b.check()


def test_standby_takes_over_when_the_lease_expires_and_the_old_leader_is_fenced(sessions):
    a, b = claim(sessions, "http://a:1", LEASE), claim(sessions, "http://b:1", LEASE)
    began = time.monotonic()  # before the renewal: however slow the steps after it, the lease runs from it
    assert a.heartbeat()
    old = FencedExecutor(FakeExecutor(), a.check)
    # a stops renewing (paused, cut off): b keeps trying and gets the lease after LEASE seconds
    wait_until(b.heartbeat, 60, interval=0.05, what="the standby to take over")
    assert LEASE * 0.8 <= time.monotonic() - began  # not before the lease ran out
    assert b.epoch == 2
    # a comes back still believing it leads: every decision and executor action is refused
    assert a.leading
    with sessions.begin() as s, pytest.raises(NotLeader):
        a.fence(s)
    with pytest.raises(NotLeader):
        old.terminate({"kind": "fake", "job_id": 1})
    assert old.inner.terminated == []
    assert not a.heartbeat() and not a.leading  # its renewal fails: it steps down
    assert b.heartbeat() and b.epoch == 2


def test_a_leader_that_stops_cleanly_hands_over_at_once(sessions):
    a, b = claim(sessions, "http://a:1"), claim(sessions, "http://b:1")
    assert a.heartbeat() and not b.heartbeat()
    a.release()
    assert b.heartbeat() and b.epoch == 2
    with sessions() as s:
        assert [sv.url for sv in live_servers(s)] == ["http://b:1"]


def test_only_one_of_several_standbys_takes_over(sessions):
    a = claim(sessions, "http://a:1")
    assert a.heartbeat()
    others = [claim(sessions, f"http://s{i}:1") for i in range(3)]
    expire(sessions)
    results = {}
    threads = [threading.Thread(target=lambda o=o: results.__setitem__(o.url, o.heartbeat())) for o in others]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results.values()) == [False, False, True]
    with sessions() as s:
        assert s.get(LeaderLease, 1).epoch == 2


@pytest.mark.slow  # it starts processes
def test_a_restarted_server_frees_the_lease_of_its_dead_self(sessions):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    a = claim(sessions, "http://a:1", lease_s=LONG)
    assert a.heartbeat()
    with sessions.begin() as s:  # as if ``a`` had been that process, killed -9 while it led
        s.execute(update(Server).where(Server.id == a.id).values(pid=dead.pid))
    again = claim(sessions, "http://a:1", lease_s=LONG)
    assert again.heartbeat() and again.epoch == 2  # at once, not after 60 s
    with sessions() as s:
        assert s.get(Server, a.id) is None


def test_a_server_not_heard_from_is_not_live(sessions):
    a, b = claim(sessions, "http://a:1"), claim(sessions, "http://b:1")
    with sessions.begin() as s:
        s.execute(update(Server).where(Server.id == b.id).values(seen_at=Server.seen_at - GONE_S - 1))
    with sessions() as s:
        assert [sv.url for sv in live_servers(s)] == ["http://a:1"]
    assert a.heartbeat() and b.heartbeat() is False
    with sessions() as s:  # b's heartbeat says it is alive again
        assert len(live_servers(s)) == 2


def test_a_new_leader_adopts_what_the_old_one_started_and_starts_nothing_twice(sessions, tmp_path):
    world = populate(sessions)
    cluster = FakeExecutor()  # one cluster, seen by both servers
    a, b = claim(sessions, "http://a:1"), claim(sessions, "http://b:1")

    def controller(lead):
        return JobController(sessions, FencedExecutor(cluster, lead.check), jobs_dir=tmp_path / "jobs",
                             api_url=lead.url, server_env={"PATH": "/usr/bin"}, fence=lead.fence)

    ra, rb = controller(a), controller(b)
    assert a.heartbeat() and not b.heartbeat()
    first = submit_job(sessions, world.alice, tmp_path, workers=1)
    ra.tick()
    rb.tick()  # nothing to decide (a fixed-size job runs, none waits): the standby writes nothing
    assert load_job(sessions, first).state == "running" and list(cluster.launched) == [first]
    with sessions.begin() as s:  # a is paused past its lease
        s.execute(update(LeaderLease).where(LeaderLease.id == 1).values(expires_at=0.0))
    assert b.heartbeat() and b.epoch == 2
    second = submit_job(sessions, world.alice, tmp_path, workers=1)
    with pytest.raises(NotLeader):
        ra.tick()  # the old leader came back: refused before it decides anything
    rb.tick()
    assert list(cluster.launched) == [first, second]  # the running job was adopted, not started again
    cluster.finish(first, {0: 0})
    rb.tick()
    assert load_job(sessions, first).state == "succeeded"


def test_a_takeover_waits_for_a_deciding_transaction_to_commit(sessions):
    """The fence locks the lease row, so a standby cannot take over between a leader's check
    and its commit (it would miss a job the leader just started)."""
    a, b = claim(sessions, "http://a:1"), claim(sessions, "http://b:1")
    assert a.heartbeat()
    took = threading.Event()
    with sessions.begin() as s:
        a.fence(s)
        # the lease runs out while the decision is being written (seen by others once it commits)
        s.execute(update(LeaderLease).where(LeaderLease.id == 1).values(expires_at=0.0))

        def standby():
            wait_until(b.heartbeat, 60, interval=0.05)
            took.set()

        t = threading.Thread(target=standby)
        t.start()
        assert not took.wait(1.0), "the standby took over in the middle of the leader's transaction"
    t.join(60)
    assert took.is_set() and b.epoch == 2
    with sessions() as s:
        assert s.scalar(select(LeaderLease.server_id)) == b.id


def test_a_leader_frozen_in_a_decision_has_its_sessions_ended_once_its_lease_is_over(pg_url):
    """PostgreSQL: a leader that stops (a paused VM) while a deciding transaction holds the
    lease row cannot block the takeover forever, and what it was deciding never lands."""
    from sqlalchemy.exc import DBAPIError

    from deeppod.store.db import make_engine, make_sessionmaker
    from deeppod.store.migrate import upgrade

    engines = [make_engine(pg_url, name=session_name(who * 16)) for who in ("a", "b")]
    upgrade(engines[0])
    sa_, sb = (make_sessionmaker(e) for e in engines)
    a = Leadership(sa_, "http://a:1", lease_s=LONG, server_id="a" * 16)
    b = Leadership(sb, "http://b:1", lease_s=LONG, server_id="b" * 16)
    a.join()
    b.join()
    assert a.heartbeat()
    frozen = sa_()
    frozen.begin()
    a.fence(frozen)  # ... and a stops here, its transaction open
    frozen.execute(update(Server).where(Server.id == a.id).values(url="decided by a"))
    expire(sb)  # its lease runs out (the key-share lock it holds lets the row's other columns change)
    wait_until(b.heartbeat, 60, interval=0.1, what="the standby to take over from the frozen leader")
    assert b.epoch == 2
    with pytest.raises(DBAPIError):  # a wakes up: its session was ended, its decision is lost
        frozen.commit()
    frozen.close()
    with sb() as s:
        assert s.get(Server, a.id).url == "http://a:1"
    for e in engines:
        e.dispose()


def test_a_solo_server_leads_without_renewals_whatever_its_database_does(sessions):
    """SQLite's one server: it takes the lease as it joins and never loses it to itself, even
    when its heartbeat cannot be written (a database busy with a burst of writes)."""
    lead = Leadership(sessions, "http://solo:1", solo=True)
    lead.join()
    assert lead.leading and lead.epoch == 1

    class Refusing:
        def begin(self):
            raise OperationalError("UPDATE servers", {}, Exception("database is locked"))

    real, lead.sessions = lead.sessions, Refusing()
    for _ in range(3):
        assert lead.heartbeat() and lead.epoch == 1
    lead.sessions = real
    with sessions.begin() as s:
        lead.fence(s)  # its decisions go on
        assert leader_url(s) == "http://solo:1"
    lead.release()
    with sessions() as s:
        assert leader_url(s) is None


def test_on_postgresql_the_lease_is_renewed_while_the_api_holds_every_connection(pg_url, tmp_path):
    from deeppod.server import _leadership
    from deeppod.settings import Settings
    from deeppod.store.db import make_engine, make_sessionmaker, pool_capacity
    from deeppod.store.migrate import upgrade

    engine = make_engine(pg_url)
    upgrade(engine)
    api = make_sessionmaker(engine)
    lead = _leadership(Settings(home=tmp_path, database_url=pg_url), api, "s1", fenced=True)
    assert lead.sessions.kw["bind"] is not engine and not lead.solo
    lead.join()
    held = [engine.connect() for _ in range(pool_capacity(engine))]  # a burst of requests holds them all
    try:
        began = time.monotonic()
        assert lead.heartbeat() and lead.epoch == 1
        assert lead.heartbeat() and lead.epoch == 1  # renewed, not waiting for the API's pool
        assert time.monotonic() - began < 5
    finally:
        for c in held:
            c.close()
        lead.release()
        lead.sessions.kw["bind"].dispose()
        engine.dispose()
