"""jobs' attained service (least-attained-service ordering)

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-23 15:40:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch_op:
        batch_op.add_column(sa.Column('attained_gpu_seconds', sa.Float(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('queued_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch_op:
        batch_op.drop_column('queued_at')
        batch_op.drop_column('attained_gpu_seconds')
