"""burst: burst nodes' types and when they joined; what tenants were charged for them

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-27 21:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0024'
down_revision = '0023'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('nodes') as batch:
        batch.add_column(sa.Column('burst', sa.String(length=64), nullable=True))
        batch.add_column(sa.Column('joined_at', sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        'burst_charges',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('node', sa.String(length=128), nullable=False),
        sa.Column('node_type', sa.String(length=64), nullable=False),
        sa.Column('tenant', sa.String(length=64), nullable=False),
        sa.Column('seconds', sa.Float(), nullable=False),
        sa.Column('cost', sa.Float(), nullable=False),
        sa.Column('first_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('last_at', sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint('node', 'tenant'),
    )
    op.create_index('ix_burst_charges_tenant', 'burst_charges', ['tenant'])


def downgrade() -> None:
    op.drop_index('ix_burst_charges_tenant', 'burst_charges')
    op.drop_table('burst_charges')
    with op.batch_alter_table('nodes') as batch:
        batch.drop_column('joined_at')
        batch.drop_column('burst')
