"""catalogue version, its change log and the index log

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 05:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    version = op.create_table(
        "catalogue_version",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("log_horizon", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_catalogue_version")),
    )
    op.bulk_insert(version, [{"id": 1, "version": 0, "log_horizon": 0}])
    op.create_table(
        "catalogue_change",
        sa.Column("version", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("parts", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("version", name=op.f("pk_catalogue_change")),
    )
    op.create_table(
        "index_log",
        sa.Column("version", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("chunk_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("cluster_id", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("version", "chunk_id", name=op.f("pk_index_log")),
    )
    with op.batch_alter_table("query_log", schema=None) as batch_op:
        batch_op.add_column(sa.Column("catalogue_version", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("query_log", schema=None) as batch_op:
        batch_op.drop_column("catalogue_version")
    op.drop_table("index_log")
    op.drop_table("catalogue_change")
    op.drop_table("catalogue_version")
