"""experts a team owns: an owned flag, stable model-id slugs, and the experts' versions
(app.clustering.expert_history) that undo restores

Experts stored before this revision count as owned: nothing automatic may undo what an
operator may have curated.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06 12:00:00
"""

import re
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("expert", sa.Column("owned", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("expert", sa.Column("slugs", sa.JSON(), nullable=True))
    expert = sa.table("expert", sa.column("id", sa.Integer), sa.column("name", sa.String), sa.column("slugs", sa.JSON))
    bind = op.get_bind()
    taken: set[str] = set()
    for id_, name in bind.execute(sa.select(expert.c.id, expert.c.name).order_by(expert.c.id)).all():
        slug = re.sub(r"[^a-z0-9]+", "-", name.casefold()).strip("-")[:64] or "expert"
        slug = slug if slug not in taken else f"{slug}-{id_}"
        taken.add(slug)
        bind.execute(sa.update(expert).where(expert.c.id == id_).values(slugs=[slug]))
    bind.execute(sa.text("UPDATE expert SET owned = :yes").bindparams(yes=True))
    op.create_table(
        "experts_version",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("action", sa.String(40), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("experts", sa.JSON(), nullable=False),
        sa.Column("clusters", sa.JSON(), nullable=False),
        sa.Column("index_version", sa.String(64), nullable=False),
        sa.Column("router_version_id", sa.Integer(), nullable=True),
        sa.Column("layout", sa.LargeBinary(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sqlite_autoincrement=True,
    )


def downgrade() -> None:
    op.drop_table("experts_version")
    with op.batch_alter_table("expert", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_column("slugs")
        batch.drop_column("owned")
