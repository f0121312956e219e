"""a job's owner: the scoped token that submitted it (it lists and reads only its own jobs)

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07 04:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("job", sa.Column("owner", sa.String(200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_column("owner")
