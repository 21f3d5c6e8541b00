"""nodes.down_reason: why a node is down, in its cluster's words (Slurm's state and Reason)

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-07 18:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0030'
down_revision = '0029'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('nodes') as batch_op:
        batch_op.add_column(sa.Column('down_reason', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('nodes') as batch_op:
        batch_op.drop_column('down_reason')
