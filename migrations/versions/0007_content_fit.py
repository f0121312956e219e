"""content fit: each chunk's cosine to its list's centroid, each list's floor (index.fit);
questions labelled "none of these / new topic"

The fits are nullable: a store migrated from 0006 gets them filled at its next start (the
runtime's back-fill), a store too small to cluster keeps them empty (fit unknown). A router
example without an expert teaches the gate's "none" class; the question log says which
questions an operator marked as a new topic.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05 02:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("chunk", sa.Column("fit", sa.Float(), nullable=True))
    op.add_column("cluster", sa.Column("fit_floor", sa.Float(), nullable=True))
    op.add_column("query_log", sa.Column("feedback_new_topic", sa.Boolean(), nullable=False, server_default=sa.false()))
    # SQLite rebuilds the table: it stays AUTOINCREMENT (0006).
    with op.batch_alter_table("router_example", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.alter_column("expert_id", existing_type=sa.Integer(), nullable=True)


def downgrade() -> None:
    op.execute("DELETE FROM router_example WHERE expert_id IS NULL")
    with op.batch_alter_table("router_example", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.alter_column("expert_id", existing_type=sa.Integer(), nullable=False)
    with op.batch_alter_table("query_log") as batch:
        batch.drop_column("feedback_new_topic")
    with op.batch_alter_table("cluster") as batch:
        batch.drop_column("fit_floor")
    with op.batch_alter_table("chunk") as batch:
        batch.drop_column("fit")
