"""SQL state of the control plane (SQLAlchemy 2 + Alembic)."""
