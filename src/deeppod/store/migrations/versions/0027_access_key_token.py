"""access_keys.token_id: the token an S3 access key was made with; the key ends when it does
(revoked or expired), and never lives past it

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-04 21:30:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0027'
down_revision = '0026'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('access_keys') as batch_op:
        batch_op.add_column(sa.Column('token_id', sa.Integer(), nullable=True))
        batch_op.create_index('ix_access_keys_token_id', ['token_id'])
        batch_op.create_foreign_key('fk_access_keys_token_id', 'tokens', ['token_id'], ['id'], ondelete='CASCADE')


def downgrade() -> None:
    with op.batch_alter_table('access_keys') as batch_op:
        batch_op.drop_constraint('fk_access_keys_token_id', type_='foreignkey')
        batch_op.drop_index('ix_access_keys_token_id')
        batch_op.drop_column('token_id')
