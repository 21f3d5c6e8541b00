"""the audit log: mutating API calls and failed sign-ins

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-22 19:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'audit_events',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('user', sa.String(length=64), nullable=True),
        sa.Column('tenant', sa.String(length=64), nullable=True),
        sa.Column('token_kind', sa.String(length=16), nullable=False),
        sa.Column('method', sa.String(length=8), nullable=False),
        sa.Column('path', sa.String(length=512), nullable=False),
        sa.Column('status', sa.Integer(), nullable=False),
        sa.Column('client', sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_audit_events_at', 'audit_events', ['at'])
    op.create_index('ix_audit_events_user', 'audit_events', ['user'])


def downgrade() -> None:
    op.drop_index('ix_audit_events_user', table_name='audit_events')
    op.drop_index('ix_audit_events_at', table_name='audit_events')
    op.drop_table('audit_events')
