"""user roles (replacing is_admin); token scopes and expiry

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-22 18:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('users', schema=None) as batch_op:
        batch_op.add_column(sa.Column('role', sa.String(length=16), nullable=False, server_default='member'))
    op.execute("UPDATE users SET role = 'admin' WHERE is_admin")
    # not batch mode: SQLite would copy the table, which jobs reference (foreign keys are on);
    # both backends drop a plain column in place (SQLite since 3.35)
    op.execute("ALTER TABLE users DROP COLUMN is_admin")
    with op.batch_alter_table('tokens', schema=None) as batch_op:
        batch_op.add_column(sa.Column('scope', sa.String(length=16), nullable=False, server_default='all'))
        batch_op.add_column(sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tokens', schema=None) as batch_op:
        batch_op.drop_column('expires_at')
        batch_op.drop_column('scope')
    with op.batch_alter_table('users', schema=None) as batch_op:
        batch_op.add_column(sa.Column('is_admin', sa.Boolean(), nullable=False, server_default=sa.false()))
    op.execute("UPDATE users SET is_admin = (role = 'admin')")
    op.execute("ALTER TABLE users DROP COLUMN role")
