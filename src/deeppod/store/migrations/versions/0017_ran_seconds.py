"""jobs: seconds run before the current run (a resumed job's duration counts every run)

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-25 21:30:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch_op:
        batch_op.add_column(sa.Column('ran_seconds', sa.Float(), nullable=False, server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch_op:
        batch_op.drop_column('ran_seconds')
