"""Apply Alembic migrations programmatically (start-up and `moerag db upgrade`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, text

import migrations


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


_MIGRATION_LOCK = 0x6D6F6D69  # "momi": processes starting together migrate one after another


@contextmanager
def _migrating(engine: Engine) -> Iterator[Connection]:
    """A connection in a transaction for Alembic. On SQLite, foreign keys are off while it runs
    (the pragma only takes effect outside a transaction) and checked before they are on again:
    rebuilding a table (migration 0006) drops the old copy, which would cascade to its children."""
    sqlite = engine.dialect.name == "sqlite"
    with engine.connect() as conn:
        if sqlite:
            conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
            conn.commit()
        try:
            with conn.begin():
                if (
                    engine.dialect.name == "postgresql"
                ):  # several workers start at once: one migrates, the rest find head
                    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK})
                yield conn
                if sqlite and (broken := conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()):
                    raise RuntimeError(f"the migration left rows whose parent is gone: {broken[:5]}")
        finally:
            if sqlite:
                conn.exec_driver_sql("PRAGMA foreign_keys=ON")
                conn.commit()


def upgrade(engine: Engine, revision: str = "head") -> None:
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with _migrating(engine) as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def downgrade(engine: Engine, revision: str) -> None:
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with _migrating(engine) as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)
