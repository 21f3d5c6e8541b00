"""The Alembic migrations build exactly the schema the models describe, on both backends."""

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text

from deeppod.store.db import make_engine
from deeppod.store.migrate import upgrade
from deeppod.store.models import Base


def test_upgrade_matches_models(db_url):
    engine = make_engine(db_url)
    upgrade(engine)
    upgrade(engine)  # idempotent: a restart runs it again
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": False}), Base.metadata)
    assert diff == [], f"models and migrations differ: {diff}"
    tables = set(inspect(engine).get_table_names())
    assert {"tenants", "users", "tokens", "nodes", "jobs", "job_events", "alembic_version"} <= tables
    engine.dispose()


def test_sqlite_uses_wal(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
    engine.dispose()
