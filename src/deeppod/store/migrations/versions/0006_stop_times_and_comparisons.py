"""job stop request times, model comparisons

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22 09:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        # when the current stop (preempt, resize, cancel, graceful stop) was asked: a checkpoint
        # newer than this was written on the way out
        batch_op.add_column(sa.Column('stop_requested_at', sa.DateTime(timezone=True), nullable=True))
    op.create_table('model_comparisons',
    sa.Column('job_id', sa.Integer(), nullable=False),
    sa.Column('model_id', sa.Integer(), nullable=False),
    sa.Column('version_a_id', sa.Integer(), nullable=False),
    sa.Column('version_b_id', sa.Integer(), nullable=False),
    sa.Column('dataset', sa.String(length=160), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['model_id'], ['models.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['version_a_id'], ['model_versions.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['version_b_id'], ['model_versions.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('job_id'),
    )
    with op.batch_alter_table('model_comparisons', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_model_comparisons_model_id'), ['model_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('model_comparisons', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_model_comparisons_model_id'))
    op.drop_table('model_comparisons')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('stop_requested_at')
