"""direct_tokens: tokens a client calls a deployment's replicas with, past the control plane

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-26 23:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'direct_tokens',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('jti', sa.String(length=32), nullable=False),
        sa.Column('deployment_id', sa.Integer(), nullable=False),
        sa.Column('via', sa.String(length=8), nullable=False),
        sa.Column('credential_hash', sa.String(length=64), nullable=False),
        sa.Column('user_id', sa.Integer(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['deployment_id'], ['deployments.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('jti'),
    )
    with op.batch_alter_table('direct_tokens') as batch_op:
        batch_op.create_index(batch_op.f('ix_direct_tokens_deployment_id'), ['deployment_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_direct_tokens_expires_at'), ['expires_at'], unique=False)


def downgrade() -> None:
    op.drop_table('direct_tokens')
