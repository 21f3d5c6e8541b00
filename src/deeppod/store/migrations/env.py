"""Alembic environment: runs on the connection that deeppod.store.migrate hands it."""

from alembic import context
from sqlalchemy import create_engine

from deeppod.store.models import Base

config = context.config
target_metadata = Base.metadata


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_on(connection)
        return
    with create_engine(config.get_main_option("sqlalchemy.url")).connect() as conn:
        _run_on(conn)


def _run_on(connection) -> None:  # noqa: ANN001
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite cannot ALTER most things
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


run()
