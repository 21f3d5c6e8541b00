"""hyperparameter search experiments and their trials (trial jobs carry their parameters and
end 'pruned' when the pruner stops them); GPU and host samples over time

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-23 10:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'experiments',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('tenant_id', sa.Integer(), sa.ForeignKey('tenants.id'), nullable=False),
        sa.Column('user_id', sa.Integer(), sa.ForeignKey('users.id'), nullable=False),
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('metric', sa.String(length=128), nullable=False),
        sa.Column('mode', sa.String(length=8), nullable=False),
        sa.Column('trials', sa.Integer(), nullable=False),
        sa.Column('parallel', sa.Integer(), nullable=False),
        sa.Column('sampler', sa.String(length=16), nullable=False),
        sa.Column('pruner', sa.String(length=16), nullable=False),
        sa.Column('seed', sa.Integer(), nullable=True),
        sa.Column('space', sa.JSON(), nullable=False),
        sa.Column('job', sa.JSON(), nullable=False),
        sa.Column('register', sa.String(length=64), nullable=True),
        sa.Column('registered', sa.String(length=160), nullable=True),
        sa.Column('best_trial', sa.Integer(), nullable=True),
        sa.Column('reason', sa.Text(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('tenant_id', 'name'),
    )
    op.create_index('ix_experiments_tenant_id', 'experiments', ['tenant_id'])
    op.create_index('ix_experiments_state', 'experiments', ['state'])
    op.create_table(
        'trials',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('experiment_id', sa.Integer(), sa.ForeignKey('experiments.id', ondelete='CASCADE'), nullable=False),
        sa.Column('number', sa.Integer(), nullable=False),
        sa.Column('study_trial_id', sa.Integer(), nullable=False),
        sa.Column('job_id', sa.Integer(), nullable=False),
        sa.Column('params', sa.JSON(), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('value', sa.Float(), nullable=True),
        sa.Column('best', sa.Float(), nullable=True),
        sa.Column('step', sa.Integer(), nullable=False),
        sa.Column('reason', sa.Text(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('experiment_id', 'number'),
    )
    op.create_index('ix_trials_experiment_id', 'trials', ['experiment_id'])
    op.create_index('ix_trials_job_id', 'trials', ['job_id'])
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('params', sa.JSON(), nullable=True))
        batch.add_column(sa.Column('stop_as', sa.String(length=16), nullable=True))
        batch.add_column(sa.Column('idle_since', sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        'gpu_samples',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('node', sa.String(length=128), nullable=False),
        sa.Column('gpu', sa.Integer(), nullable=False),
        sa.Column('at', sa.Float(), nullable=False),
        sa.Column('period', sa.Integer(), nullable=False),
        sa.Column('util', sa.Float(), nullable=False),
        sa.Column('memory_used_mb', sa.Float(), nullable=False),
        sa.Column('memory_total_mb', sa.Float(), nullable=False),
        sa.Column('power_w', sa.Float(), nullable=False),
        sa.Column('temperature_c', sa.Float(), nullable=False),
        sa.Column('ecc_uncorrected', sa.BigInteger(), nullable=False),
        sa.Column('xid', sa.BigInteger(), nullable=False),
        sa.Column('job_id', sa.Integer(), nullable=True),
        sa.Column('tenant_id', sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_gpu_samples_series', 'gpu_samples', ['period', 'node', 'gpu', 'at'])
    op.create_index('ix_gpu_samples_job', 'gpu_samples', ['job_id', 'at'])
    op.create_table(
        'host_samples',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('node', sa.String(length=128), nullable=False),
        sa.Column('at', sa.Float(), nullable=False),
        sa.Column('period', sa.Integer(), nullable=False),
        sa.Column('cpu_percent', sa.Float(), nullable=False),
        sa.Column('memory_used_mb', sa.Float(), nullable=False),
        sa.Column('memory_total_mb', sa.Float(), nullable=False),
        sa.Column('disk_used_percent', sa.Float(), nullable=False),
        sa.Column('net_rx_bps', sa.Float(), nullable=False),
        sa.Column('net_tx_bps', sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_host_samples_series', 'host_samples', ['period', 'node', 'at'])


def downgrade() -> None:
    op.drop_index('ix_host_samples_series', table_name='host_samples')
    op.drop_table('host_samples')
    op.drop_index('ix_gpu_samples_job', table_name='gpu_samples')
    op.drop_index('ix_gpu_samples_series', table_name='gpu_samples')
    op.drop_table('gpu_samples')
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('idle_since')
        batch.drop_column('stop_as')
        batch.drop_column('params')
    op.drop_index('ix_trials_job_id', table_name='trials')
    op.drop_index('ix_trials_experiment_id', table_name='trials')
    op.drop_table('trials')
    op.drop_index('ix_experiments_state', table_name='experiments')
    op.drop_index('ix_experiments_tenant_id', table_name='experiments')
    op.drop_table('experiments')
