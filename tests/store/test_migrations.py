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


def test_upgrade_keeps_existing_jobs(db_url):
    """A database at the first revision with a job in it upgrades and keeps the job."""
    engine = make_engine(db_url)
    upgrade(engine, "0001")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO tenants (id, name, created_at) VALUES (1, 't', CURRENT_TIMESTAMP)"))
        conn.execute(text("INSERT INTO users (id, name, tenant_id, is_admin, created_at) "
                          "VALUES (1, 'u', 1, false, CURRENT_TIMESTAMP)"))
        conn.execute(text(
            "INSERT INTO jobs (id, name, tenant_id, user_id, state, command, workdir, env, workers, gpus_per_worker, "
            "cpus_per_worker, priority, grace_seconds, restart_count, cancel_requested, reason, submitted_at) "
            "VALUES (1, 'old', 1, 1, 'queued', '[\"true\"]', '/tmp', '{}', 2, 1, 1.0, 0, 30, 0, false, '', "
            "CURRENT_TIMESTAMP)"))
    upgrade(engine)
    with engine.connect() as conn:
        row = conn.execute(text("SELECT name, workers, max_restarts, preemptible, avoid FROM jobs")).one()
    assert row[0] == "old" and row[1] == 2 and row[2] == 0 and bool(row[3]) is True
    engine.dispose()
