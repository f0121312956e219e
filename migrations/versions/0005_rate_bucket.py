"""the /ask rate limit's buckets, shared by every worker

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 21:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "rate_bucket",
        sa.Column("client", sa.String(length=64), nullable=False),
        sa.Column("tat", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("client", name=op.f("pk_rate_bucket")),
    )


def downgrade() -> None:
    op.drop_table("rate_bucket")
