"""job_samples: what a running job's processes use over time (CPU seconds, resident memory),
for the CPU and memory charts on its page

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-06 03:20:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0028'
down_revision = '0027'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'job_samples',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('job_id', sa.Integer(), nullable=False),
        sa.Column('at', sa.Float(), nullable=False),
        sa.Column('cpu_seconds', sa.Float(), nullable=False),
        sa.Column('memory_mb', sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_job_samples_series', 'job_samples', ['job_id', 'at'])


def downgrade() -> None:
    op.drop_index('ix_job_samples_series', table_name='job_samples')
    op.drop_table('job_samples')
