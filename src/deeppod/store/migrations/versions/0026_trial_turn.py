"""trials.turn: how many times a search's trial was handed to its process (a paused trial resumed
is handed again; the process's other ranks tell the turns apart)

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-29 03:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0026'
down_revision = '0025'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('trials') as batch_op:
        batch_op.add_column(sa.Column('turn', sa.Integer(), nullable=False, server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('trials') as batch_op:
        batch_op.drop_column('turn')
