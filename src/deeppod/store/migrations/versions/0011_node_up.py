"""whether a node answers (a Ray node that left is down), apart from an administrator's cordon

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-22 21:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('nodes') as batch:
        batch.add_column(sa.Column('up', sa.Boolean(), nullable=False, server_default=sa.true()))


def downgrade() -> None:
    with op.batch_alter_table('nodes') as batch:
        batch.drop_column('up')
