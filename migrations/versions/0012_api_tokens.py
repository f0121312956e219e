"""scoped API tokens: named, hashed, revocable, expiring; a role and a scope each; a
conversation turn's owner (the scoped token that asked it)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06 22:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "api_token",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("scope", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sqlite_autoincrement=True,
    )
    op.add_column("conversation_turn", sa.Column("owner", sa.String(200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("conversation_turn", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_column("owner")
    op.drop_table("api_token")
