"""servers of a failover control plane, the leader's lease with its fencing epoch, and which
server builds an ingesting dataset version

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-22 23:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'servers',
        sa.Column('id', sa.String(length=32), nullable=False),
        sa.Column('url', sa.String(length=512), nullable=False),
        sa.Column('host', sa.String(length=255), nullable=False),
        sa.Column('pid', sa.Integer(), nullable=False),
        sa.Column('started_at', sa.Float(), nullable=False),
        sa.Column('seen_at', sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_servers_seen_at', 'servers', ['seen_at'])
    op.create_table(
        'leadership',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('server_id', sa.String(length=32), nullable=True),
        sa.Column('url', sa.String(length=512), nullable=False),
        sa.Column('epoch', sa.BigInteger(), nullable=False),
        sa.Column('expires_at', sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    with op.batch_alter_table('dataset_versions') as batch:
        batch.add_column(sa.Column('ingest_server', sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('dataset_versions') as batch:
        batch.drop_column('ingest_server')
    op.drop_table('leadership')
    op.drop_index('ix_servers_seen_at', table_name='servers')
    op.drop_table('servers')
