"""experts defined by documents: a selector of ids, a source folder or a tag
(app.services.expert_scopes); null for an expert defined by its clusters

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05 12:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("expert", sa.Column("documents", sa.JSON(), nullable=True))


def downgrade() -> None:
    # SQLite rebuilds the table: it stays AUTOINCREMENT (0006).
    with op.batch_alter_table("expert", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_column("documents")
