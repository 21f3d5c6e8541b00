"""experiments.reuse, trials.claimed_at and done_at, job_metrics.trial: a search's process runs trial after trial

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-26 19:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('experiments') as batch_op:
        batch_op.add_column(sa.Column('reuse', sa.Boolean(), nullable=False, server_default=sa.false()))
    with op.batch_alter_table('trials') as batch_op:
        batch_op.add_column(sa.Column('claimed_at', sa.DateTime(), nullable=True))
        batch_op.add_column(sa.Column('done_at', sa.DateTime(), nullable=True))
    with op.batch_alter_table('job_metrics') as batch_op:
        batch_op.add_column(sa.Column('trial', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('job_metrics') as batch_op:
        batch_op.drop_column('trial')
    with op.batch_alter_table('trials') as batch_op:
        batch_op.drop_column('done_at')
        batch_op.drop_column('claimed_at')
    with op.batch_alter_table('experiments') as batch_op:
        batch_op.drop_column('reuse')
