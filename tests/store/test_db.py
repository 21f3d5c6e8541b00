"""Engines and sessions (store/db.py): a commit that touches a watched table wakes whoever
waits for it; on SQLite one writer at a time, so that a burst of transactions that read and
then write never sees "database is locked"; reads beside it in read-only sessions, which
cannot write; on both databases."""

import threading
import time

import pytest
from sqlalchemy import select, text

from deeppod.errors import DatabaseMisuse
from deeppod.store.db import on_commit_of, pool_capacity, read_only
from deeppod.store.models import Job, Node, Tenant
from tests.fixtures import populate, submit_job


def test_a_commit_that_adds_a_watched_row_calls_back_once(sessions, tmp_path):
    world = populate(sessions)
    calls = []
    on_commit_of(sessions, (Job,), lambda: calls.append(1))
    with sessions.begin() as s:
        s.query(Node).first().cpus += 1  # another table: no call
    assert calls == []
    jid = submit_job(sessions, world.alice, tmp_path, workers=1)
    assert calls == [1]
    try:
        with sessions.begin() as s:
            s.get(Job, jid).reason = "changed"
            s.flush()
            raise RuntimeError("rolled back")
    except RuntimeError:
        pass
    assert calls == [1]  # nothing was committed
    with sessions.begin() as s:
        s.get(Job, jid).reason = "changed"
    assert calls == [1, 1]


def test_which_narrows_the_callback_to_the_rows_it_names(sessions, tmp_path):
    """How a search's next trial is asked for at once (server._on_commits): a callback for a
    job whose state moved, not for every change of a job."""
    from sqlalchemy import inspect

    from deeppod.contract import JobState

    world = populate(sessions)
    jid = submit_job(sessions, world.alice, tmp_path, workers=1)
    calls = []
    on_commit_of(sessions, (Job,), lambda: calls.append(1),
                 which=lambda job: inspect(job).attrs.state.history.has_changes())
    with sessions.begin() as s:
        s.get(Job, jid).reason = "a change that moves nothing"
    assert calls == []
    with sessions.begin() as s:
        s.get(Job, jid).state = JobState.RUNNING
    assert calls == [1]
    added = []
    on_commit_of(sessions, (Job,), lambda: added.append(1), added_only=True)
    with sessions.begin() as s:
        s.get(Job, jid).reason = "changed, not added"
    assert added == []
    submit_job(sessions, world.alice, tmp_path, workers=1)
    assert added == [1]


def test_a_burst_of_read_then_write_transactions_all_commit(sessions):
    """Each transaction reads a counter, then writes it one higher: the pattern that, begun
    deferred on SQLite, fails at once ("database is locked") when another commit landed
    between its read and its write. Every increment must land, no error."""
    world = populate(sessions)
    errors, threads = [], []

    def bump(n: int) -> None:
        for _ in range(n):
            try:
                with sessions.begin() as s:
                    tenant = s.get(Tenant, world.alice.tenant_id)
                    value = tenant.storage_bytes or 0
                    time.sleep(0.0005)  # widen the window between the read and the write
                    tenant.storage_bytes = value + 1
            except Exception as exc:  # noqa: BLE001 - the test counts them
                errors.append(repr(exc))

    for _ in range(8):
        threads.append(threading.Thread(target=bump, args=(25,)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    if sessions.kw["bind"].dialect.name == "sqlite":  # one writer at a time: no lost update either
        with sessions() as s:
            assert s.get(Tenant, world.alice.tenant_id).storage_bytes == 200


def test_reads_go_on_while_a_writer_holds_its_turn(sessions):
    world = populate(sessions)
    reads = read_only(sessions)
    holding, release = threading.Event(), threading.Event()

    def writer() -> None:
        with sessions.begin() as s:
            s.get(Tenant, world.alice.tenant_id).storage_bytes = 7
            s.flush()
            holding.set()
            release.wait(30)

    t = threading.Thread(target=writer)
    t.start()
    try:
        assert holding.wait(30)
        began = time.monotonic()
        with reads() as s:  # not blocked by the open write
            assert s.scalar(select(Tenant.name).where(Tenant.id == world.alice.tenant_id)) == "a"
        assert time.monotonic() - began < 5
    finally:
        release.set()
        t.join()
    with reads() as s:
        assert s.get(Tenant, world.alice.tenant_id).storage_bytes == 7


def test_a_writers_turn_is_given_back_however_its_transaction_ends(sessions):
    world = populate(sessions)
    with pytest.raises(ZeroDivisionError):
        with sessions.begin() as s:
            s.get(Tenant, world.alice.tenant_id).storage_bytes = 1
            1 / 0  # noqa: B018 - rolled back
    s = sessions()
    s.get(Tenant, world.alice.tenant_id)
    s.close()  # ended without commit or rollback: closed
    with pytest.raises(Exception):
        with sessions.begin() as s:
            s.execute(text("SELECT * FROM no_such_table"))
    done = threading.Event()

    def later() -> None:
        with sessions.begin() as s:
            s.get(Tenant, world.alice.tenant_id).storage_bytes = 3
        done.set()

    threading.Thread(target=later).start()
    assert done.wait(10)  # nobody kept the turn


def test_a_read_only_session_cannot_write(sessions):
    world = populate(sessions)
    reads = read_only(sessions)
    if sessions.kw["bind"].dialect.name == "postgresql":  # each read its own statement: no BEGIN, no ROLLBACK
        with reads() as s:
            assert s.connection().connection.dbapi_connection.autocommit is True
    with pytest.raises(DatabaseMisuse, match="read-only"):
        with reads.begin() as s:
            s.get(Tenant, world.alice.tenant_id).storage_bytes = 9
    with sessions() as s:
        assert s.get(Tenant, world.alice.tenant_id).storage_bytes != 9


def test_the_pool_serves_what_admission_lets_in(sessions):
    assert pool_capacity(sessions.kw["bind"]) >= 30


def test_on_sqlite_a_transaction_that_may_write_is_refused_on_the_event_loop(sessions):
    """Waiting for the writer's turn on the event loop stops every request of the server (a
    console save did so for 30 s while a worker thread held the turn, and answered 503): it is
    refused at once, saying what to do; reads, and the same write off the loop, go on."""
    import asyncio

    world = populate(sessions)
    sqlite = sessions.kw["bind"].dialect.name == "sqlite"

    async def on_the_loop():
        with read_only(sessions)() as s:
            assert s.get(Tenant, world.alice.tenant_id).name == "a"
        with sessions() as s:
            s.get(Tenant, world.alice.tenant_id)

    if sqlite:
        with pytest.raises(DatabaseMisuse, match="began on the event loop: run it in the thread pool"):
            asyncio.run(on_the_loop())
    else:  # PostgreSQL has no turn to wait for
        asyncio.run(on_the_loop())

    async def off_the_loop():
        def write():
            with sessions.begin() as s:
                s.get(Tenant, world.alice.tenant_id).storage_bytes = 5
        await asyncio.to_thread(write)

    asyncio.run(off_the_loop())
    with sessions() as s:
        assert s.get(Tenant, world.alice.tenant_id).storage_bytes == 5


def test_a_writer_that_gave_up_is_told_where_the_holder_is(sessions, caplog, monkeypatch):
    if sessions.kw["bind"].dialect.name != "sqlite":
        pytest.skip("the writer's turn is SQLite's")
    from deeppod.errors import Busy
    from deeppod.store import db

    monkeypatch.setattr(db, "WRITER_WAIT_S", 0.2)
    world = populate(sessions)
    holding, release = threading.Event(), threading.Event()

    def hold_the_writer_in_a_named_place() -> None:
        with sessions.begin() as s:
            s.get(Tenant, world.alice.tenant_id).storage_bytes = 1
            holding.set()
            release.wait(30)

    t = threading.Thread(target=hold_the_writer_in_a_named_place, name="the-holder")
    t.start()
    try:
        assert holding.wait(30)
        with pytest.raises(Busy), sessions.begin() as s:
            s.get(Tenant, world.alice.tenant_id)
    finally:
        release.set()
        t.join()
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "the-holder, now at:" in said and "hold_the_writer_in_a_named_place" in said, said
