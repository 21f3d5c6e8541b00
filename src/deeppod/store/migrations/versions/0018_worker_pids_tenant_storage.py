"""jobs: the processes a worker may have (its own limit), its network and its Python environment; tenants: the disk
their job folders take

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-26 04:10:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch_op:
        batch_op.add_column(sa.Column('pids_per_worker', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('network', sa.String(length=16), nullable=False, server_default='host'))
        batch_op.add_column(sa.Column('requirements', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('python', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('env_key', sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column('phase', sa.String(length=64), nullable=True))
        batch_op.create_index('ix_jobs_env_key', ['env_key'], unique=False)
    with op.batch_alter_table('tenants') as batch_op:
        batch_op.add_column(sa.Column('storage_bytes', sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tenants') as batch_op:
        batch_op.drop_column('storage_bytes')
    with op.batch_alter_table('jobs') as batch_op:
        batch_op.drop_index('ix_jobs_env_key')
        for column in ('phase', 'env_key', 'python', 'requirements', 'network'):
            batch_op.drop_column(column)
        batch_op.drop_column('pids_per_worker')
