"""jobs.idle_limit_seconds: a notebook is stopped after this long without kernel activity

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-07 20:30:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0031'
down_revision = '0030'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch_op:
        batch_op.add_column(sa.Column('idle_limit_seconds', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch_op:
        batch_op.drop_column('idle_limit_seconds')
