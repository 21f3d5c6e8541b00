"""jobs: the processes a worker may have (its own limit) and its network; tenants: the disk their job folders take

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-26 04:10:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch_op:
        batch_op.add_column(sa.Column('pids_per_worker', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('network', sa.String(length=16), nullable=False, server_default='host'))
    with op.batch_alter_table('tenants') as batch_op:
        batch_op.add_column(sa.Column('storage_bytes', sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tenants') as batch_op:
        batch_op.drop_column('storage_bytes')
    with op.batch_alter_table('jobs') as batch_op:
        batch_op.drop_column('network')
        batch_op.drop_column('pids_per_worker')
