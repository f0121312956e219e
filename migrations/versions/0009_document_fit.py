"""document fit: each document's fit against the content the experts were fitted on, and where
that content ends (index.fit)

Both are nullable: a store migrated from 0008 gets them at its next start (the runtime's
back-fill counts everything stored then as fitted content); a document without a fit is unknown,
never a new topic.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05 11:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("document", sa.Column("fit", sa.Float(), nullable=True))
    op.add_column("index_state", sa.Column("fitted_through", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("index_state") as batch:
        batch.drop_column("fitted_through")
    # SQLite rebuilds the table: it stays AUTOINCREMENT (0006).
    with op.batch_alter_table("document", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_column("fit")
