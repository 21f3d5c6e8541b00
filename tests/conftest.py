from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest
from fastapi.testclient import TestClient

from deeppod.cluster.gpus import LogicalProbe
from deeppod.executor import sandbox as _sandbox
from deeppod.executor.fake import FakeExecutor
from deeppod.server import bootstrap_admin, build, http_app
from deeppod.settings import Settings
from deeppod.store.db import make_engine, make_sessionmaker
from deeppod.store.migrate import upgrade
from tests.helpers import LiveServer

# What starts a process once per interpreter, done here, before any test's process watch: torch's
# first import runs ldconfig (cuda.pathfinder), and the sandbox probe forks (e2e modules ask it at
# import, which a quick test that collects them in-process would otherwise count as its own)
try:
    import torch  # noqa: F401
except ImportError:
    pass

_sandbox.supported()

# Tests that start real servers or processes are 'slow' (deselect with -m "not slow"): by
# the fixtures they use, the folder they live in, or their own mark, so a new one cannot forget
# it. A test that is not slow and starts a process anyway fails (_quick_tests_start_no_processes).
SLOW_FIXTURES = {"live_server", "fresh_server", "cli"}
SLOW_PATHS = ("tests/e2e/", "tests/executor/test_local.py", "tests/executor/test_sandbox.py", "tests/cli/test_cli.py",
              "tests/executor/test_ray.py", "tests/bench/test_scripts.py")
# seconds to a minute a file, after the slowest: training processes, a browser sweep
LONG_PATHS = ("tests/runtime/", "tests/ui/test_no_5xx.py")
# the files that take longest, first of all (minutes each on one worker): started last, one would
# be the run's tail while the other workers wait
LONGEST = ("tests/bench/test_scripts.py", "tests/executor/test_ray.py", "tests/e2e/test_training.py",
           "tests/e2e/test_stop_resume.py", "tests/e2e/test_serving.py", "tests/e2e/test_console.py")


def pytest_collection_modifyitems(config, items):
    root = str(config.rootpath)
    for item in items:
        where = str(item.path).removeprefix(root).lstrip("/")
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) or where.startswith(SLOW_PATHS):
            item.add_marker(pytest.mark.slow)
    # Long files first: xdist (scripts/test: --dist loadfile --no-loadscope-reorder) hands files
    # out in this order as workers free up, so a run ends on short unit-test files, not with one
    # worker on a long end-to-end file while the other waits (its own order puts the files with
    # the fewest tests, often the longest, last). A stable sort: a file's tests stay together
    # and in order.
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}

    def weight(item) -> int:
        where = str(item.path).removeprefix(root).lstrip("/")
        if where in LONGEST:
            return LONGEST.index(where) - len(LONGEST)
        if item.path in slow_files:
            return 0
        return 1 if where.startswith(LONG_PATHS) else 2

    items.sort(key=weight)


PG_ADMIN_URL = os.environ.get("DEEPPOD_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _pg_database():
    """A fresh PostgreSQL database for one test run; dropped afterwards."""
    import sqlalchemy as sa

    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"deeppod_test_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as c:
            c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as exc:
        admin.dispose()
        if os.environ.get("DEEPPOD_REQUIRE_POSTGRES"):
            raise
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL}: {exc.orig}")
    url = admin.url.set(database=name).render_as_string(hide_password=False)
    return admin, name, url


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """A new, empty database (no tables: the migrations' own tests)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'deeppod.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def pg_url():
    """A fresh PostgreSQL database (for what SQLite cannot do: several servers on one database)."""
    import sqlalchemy as sa

    admin, name, url = _pg_database()
    yield url
    with admin.connect() as c:
        c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def _migrated_sqlite(tmp_path_factory):
    """An empty database at the newest revision, made once: each test starts from a copy."""
    path = tmp_path_factory.mktemp("template") / "deeppod.db"
    engine = make_engine(f"sqlite:///{path}")
    upgrade(engine)
    engine.dispose()  # the last connection's close folds the WAL into the file
    return path


@pytest.fixture(scope="session")
def _migrated_postgresql():
    """One PostgreSQL database at the newest revision for this test process, emptied before each
    test that uses it (TRUNCATE, 0.07 s, where a new one and its migration cost 0.45 s)."""
    import sqlalchemy as sa

    admin, name, url = _pg_database()
    engine = make_engine(url)
    upgrade(engine)
    with engine.connect() as c:
        tables = [t for t in sa.inspect(c).get_table_names() if t != "alembic_version"]
    engine.dispose()
    yield url, name, tables
    with admin.connect() as c:
        c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _emptied(url: str, name: str, tables: list[str]) -> None:
    """As new: every row gone, ids from 1, no session of an earlier test left holding a lock."""
    import sqlalchemy as sa

    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as c:
        c.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = :name AND pid <> pg_backend_pid()"), {"name": name})
        c.execute(sa.text("TRUNCATE " + ", ".join(f'"{t}"' for t in tables) + " RESTART IDENTITY CASCADE"))
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def sessions(request, tmp_path):
    """Sessions of an empty database at the newest revision, on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        path = tmp_path / "deeppod.db"
        shutil.copyfile(request.getfixturevalue("_migrated_sqlite"), path)
        engine = make_engine(f"sqlite:///{path}")
    else:
        url, name, tables = request.getfixturevalue("_migrated_postgresql")
        _emptied(url, name, tables)
        engine = make_engine(url)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture(scope="module")
def live_server(tmp_path_factory):
    server = LiveServer(tmp_path_factory.mktemp("live")).start()
    yield server
    server.stop()
    server.cleanup_jobs()


@pytest.fixture
def fresh_server(tmp_path):
    server = LiveServer(tmp_path / "home")
    yield server
    server.stop()
    server.cleanup_jobs()

class Api:
    def __init__(self, ctx, http: TestClient, admin: str):
        self.ctx, self.http, self.admin = ctx, http, admin

    def as_(self, token):
        return {"Authorization": f"Bearer {token}"}

    def user(self, name: str, tenant: str, role: str = "member") -> str:
        self.http.post("/v1/tenants", json={"name": tenant}, headers=self.as_(self.admin))
        r = self.http.post("/v1/users", json={"name": name, "tenant": tenant, "role": role},
                           headers=self.as_(self.admin))
        assert r.status_code == 201, r.text
        return r.json()["token"]


@pytest.fixture
def api(tmp_path, _migrated_sqlite):
    # several tenants in one process with the fake executor: the API's own isolation is under test here
    (tmp_path / "home").mkdir()
    shutil.copyfile(_migrated_sqlite, tmp_path / "home" / "deeppod.db")  # migrated once, not per test
    settings = Settings(home=tmp_path / "home", max_body_bytes=64 * 1024, cpus=8, memory_mb=16384,
                        isolation="single-user", env_no_index=True)  # no package index reached from here
    ctx = build(settings, executor=FakeExecutor(), probe=LogicalProbe(4))
    admin = bootstrap_admin(ctx)
    with TestClient(http_app(ctx)) as http:
        yield Api(ctx, http, admin)
    ctx.engine.dispose()


class _ProcessWatch:
    """Counts the processes this interpreter starts while it is on: every way one is started
    (subprocess, multiprocessing's fork, spawn and fork server, os.posix_spawn) goes through these."""

    def __init__(self):
        import _posixsubprocess

        self.calls: list = []
        self._mp = pytest.MonkeyPatch()
        for owner, name in ((_posixsubprocess, "fork_exec"), (subprocess, "_fork_exec"), (os, "fork"),
                            (os, "posix_spawn")):
            self._mp.setattr(owner, name, self._counting(getattr(owner, name)))

    def _counting(self, real):
        def start(*args, **kw):
            self.calls.append(args[0] if args else kw)
            return real(*args, **kw)
        return start

    def stop(self) -> list:
        self._mp.undo()
        return self.calls


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    """``-m "not slow"`` is the quick run: a test in it that starts a process (a server, a worker,
    an interpreter), in its fixtures too, fails in its teardown, saying so."""
    if item.get_closest_marker("slow") is None:
        item.stash[_WATCH] = _ProcessWatch()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    result = yield
    watch = item.stash.get(_WATCH, None)
    if watch is not None and (calls := watch.stop()):
        raise AssertionError(f"this test started {len(calls)} process(es), first {calls[0]!r}: mark it slow "
                             "(@pytest.mark.slow, or pytestmark in its file), so that the quick run starts none")
    return result


_WATCH = pytest.StashKey[_ProcessWatch]()


# DEEPPOD_TEST_CPU_REPORT=FILE: each test appends "SECONDS FILE::TEST", the CPU it cost this process
# and the processes it started and waited for (its servers, workers, CLI runs): what the suite's
# time on two cores is made of (scripts/test_cpu sums it per file)
_CPU_REPORT = os.environ.get("DEEPPOD_TEST_CPU_REPORT")


def _cpu_now() -> float:
    import resource

    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _CPU_REPORT:
        return (yield)
    began = _cpu_now()
    try:
        return (yield)
    finally:
        with open(_CPU_REPORT, "a") as f:
            f.write(f"{_cpu_now() - began:.2f} {item.nodeid}\n")
