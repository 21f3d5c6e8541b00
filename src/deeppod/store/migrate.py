"""Bring a database to the newest schema with Alembic (run at server start and by tests)."""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Engine

log = logging.getLogger(__name__)
_HERE = Path(__file__).parent


def alembic_config(url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(_HERE / "migrations"))
    if url:
        cfg.set_main_option("sqlalchemy.url", url)
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    cfg = alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
    log.debug("database at %s is at revision %s", engine.url.render_as_string(hide_password=True), revision)
