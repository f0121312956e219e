"""revoked console sessions

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 23:55:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "revoked_session",
        sa.Column("signature", sa.String(length=64), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("signature", name=op.f("pk_revoked_session")),
    )
    with op.batch_alter_table("revoked_session", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_revoked_session_expires_at"), ["expires_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("revoked_session", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_revoked_session_expires_at"))
    op.drop_table("revoked_session")
