"""experiments.prune_after: the first step a search's pruner may stop a trial at

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-28 15:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0025'
down_revision = '0024'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('experiments') as batch_op:
        batch_op.add_column(sa.Column('prune_after', sa.Integer(), nullable=False, server_default='1'))


def downgrade() -> None:
    with op.batch_alter_table('experiments') as batch_op:
        batch_op.drop_column('prune_after')
