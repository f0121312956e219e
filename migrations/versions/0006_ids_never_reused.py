"""ids that leave the server are never handed out again (SQLite AUTOINCREMENT)

SQLite reuses the largest rowid of an `INTEGER PRIMARY KEY` table once that row is deleted, so
deleting the newest document gave its id to the next upload. AUTOINCREMENT keeps the largest
id ever used in `sqlite_sequence`. Each table is rebuilt with its rows and ids (SQLite cannot
alter a primary key in place); the copy seeds the sequence with the largest id present. Ids
deleted above that before this revision cannot be known and may still come back once.
PostgreSQL's sequences never reuse an id: nothing to do there.

`app.core.migrate` turns foreign keys off around the migration on SQLite, as SQLite's own procedure
for rebuilding a table asks: dropping the old `document` would otherwise cascade to `chunk`.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04 23:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Every table whose id a client sees (API paths, responses, citations, the question log).
TABLES = ("document", "job", "expert", "router_version", "router_example", "query_log")


def _rebuild(autoincrement: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table in TABLES:
        with op.batch_alter_table(
            table, recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}
        ) as batch_op:
            batch_op.alter_column("id", autoincrement=True)


def upgrade() -> None:
    _rebuild(True)


def downgrade() -> None:
    _rebuild(False)
