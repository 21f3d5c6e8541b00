from __future__ import annotations

import os
import uuid

import pytest
from fastapi.testclient import TestClient

from deeppod.cluster.gpus import LogicalProbe
from deeppod.executor.fake import FakeExecutor
from deeppod.server import bootstrap_admin, build, http_app
from deeppod.settings import Settings
from deeppod.store.db import make_engine, make_sessionmaker
from deeppod.store.migrate import upgrade
from tests.helpers import LiveServer

# Tests that start real servers or processes are 'slow' (deselect with -m "not slow"): by
# the fixtures they use or the folder they live in, so a new one cannot forget the mark.
SLOW_FIXTURES = {"live_server", "fresh_server", "cli"}
SLOW_PATHS = ("tests/e2e/", "tests/executor/test_local.py", "tests/executor/test_sandbox.py", "tests/cli/test_cli.py")
# not 'slow' (no server), but seconds to a minute a file: training processes, a browser sweep
LONG_PATHS = ("tests/runtime/", "tests/test_markers.py", "tests/ui/test_no_5xx.py")


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
        if item.path in slow_files:
            return 0
        return 1 if str(item.path).removeprefix(root).lstrip("/").startswith(LONG_PATHS) else 2

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


@pytest.fixture
def sessions(db_url):
    engine = make_engine(db_url)
    upgrade(engine)
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
def api(tmp_path):
    # several tenants in one process with the fake executor: the API's own isolation is under test here
    settings = Settings(home=tmp_path / "home", max_body_bytes=64 * 1024, cpus=8, memory_mb=16384,
                        isolation="single-user")
    ctx = build(settings, executor=FakeExecutor(), probe=LogicalProbe(4))
    admin = bootstrap_admin(ctx)
    with TestClient(http_app(ctx)) as http:
        yield Api(ctx, http, admin)
    ctx.engine.dispose()
