"""jobs.time_limit_seconds: the longest one run of a job may last (deeppod submit --time; Slurm's --time);
jobs.phase as text: Slurm's waiting reasons in DeepPod's words are longer than 64 characters

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-07 02:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0029'
down_revision = '0028'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch_op:
        batch_op.add_column(sa.Column('time_limit_seconds', sa.Float(), nullable=True))
        batch_op.alter_column('phase', type_=sa.Text(), existing_type=sa.String(64), existing_nullable=True)


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch_op:
        batch_op.alter_column('phase', type_=sa.String(64), existing_type=sa.Text(), existing_nullable=True)
        batch_op.drop_column('time_limit_seconds')
