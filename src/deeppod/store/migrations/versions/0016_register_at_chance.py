"""experiments: register the best model even when it is no better than chance

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-25 21:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('experiments') as batch_op:
        batch_op.add_column(sa.Column('register_at_chance', sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table('experiments') as batch_op:
        batch_op.drop_column('register_at_chance')
