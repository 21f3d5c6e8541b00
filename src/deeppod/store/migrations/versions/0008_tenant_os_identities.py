"""each tenant's OS identity (made on demand when jobs run sandboxed); what a platform job may read

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-22 15:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tenants', schema=None) as batch_op:
        batch_op.add_column(sa.Column('os_user', sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column('os_uid', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('os_gid', sa.Integer(), nullable=True))
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('read_paths', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('read_paths')
    with op.batch_alter_table('tenants', schema=None) as batch_op:
        batch_op.drop_column('os_gid')
        batch_op.drop_column('os_uid')
        batch_op.drop_column('os_user')
