"""jobs.models: registered model versions a job reads, pinned at submit (DEEPPOD_MODEL_<NAME>)

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-08 00:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0032'
down_revision = '0031'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch_op:
        batch_op.add_column(sa.Column('models', sa.JSON(), nullable=False, server_default='[]'))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch_op:
        batch_op.drop_column('models')
