"""gpu_memory: the memory each of a job's GPUs must have

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-27 18:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0023'
down_revision = '0022'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('gpu_memory_mb', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('gpu_memory_mb')
