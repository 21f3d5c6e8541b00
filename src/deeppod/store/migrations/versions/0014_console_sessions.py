"""web console sign-ins

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-23 12:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'console_sessions',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('secret_hash', sa.String(length=64), nullable=False),
        sa.Column('token_id', sa.Integer(), nullable=False),
        sa.Column('csrf', sa.String(length=64), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['token_id'], ['tokens.id']),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('secret_hash'),
    )
    op.create_index('ix_console_sessions_token_id', 'console_sessions', ['token_id'])


def downgrade() -> None:
    op.drop_index('ix_console_sessions_token_id', table_name='console_sessions')
    op.drop_table('console_sessions')
