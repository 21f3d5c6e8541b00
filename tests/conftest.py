from __future__ import annotations

import os
import uuid

import pytest

from deeppod.store.db import make_engine, make_sessionmaker
from deeppod.store.migrate import upgrade
from tests.helpers import LiveServer

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
        yield f"sqlite:///{tmp_path / 'deeppod.db'}"
        return
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
