"""conversations: each turn of a conversation, as asked and as routed

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "conversation_turn",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("conversation_id", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("question", sa.Text(), nullable=False),
        sa.Column("standalone", sa.Text(), nullable=False),
        sa.Column("answer", sa.Text(), nullable=True),
        sa.Column("route", sa.JSON(), nullable=False),
        sa.Column("cited", sa.JSON(), nullable=False),
        sa.Column("query_id", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_conversation_turn")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_conversation_turn_conversation_id"), "conversation_turn", ["conversation_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_conversation_turn_conversation_id"), table_name="conversation_turn")
    op.drop_table("conversation_turn")
