"""Copy a whole catalogue to another database: how a single-machine SQLite store moves to
PostgreSQL when a team grows (then `moerag serve --workers N`)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import Engine, Integer, delete, func, insert, select, text

from app.core.migrate import upgrade
from app.core.models import Base

log = logging.getLogger(__name__)
Progress = Callable[[str, int, int], None]  # (table, rows copied, rows in it)
_BATCH = 2000


class TargetNotEmpty(RuntimeError):
    pass


def copy_database(source: Engine, target: Engine, progress: Progress | None = None) -> dict[str, int]:
    """Every row of every table, parents first, in one transaction on the target (all or nothing);
    the target is migrated to head first and must hold no documents. Returns rows per table."""
    report = progress or (lambda table, done, total: None)
    upgrade(target)
    counts: dict[str, int] = {}
    with source.connect() as src, target.begin() as dst:
        seeded = {"catalogue_version"}  # rows the migrations write themselves
        held = [
            t.name
            for t in Base.metadata.sorted_tables
            if t.name not in seeded and dst.scalar(select(func.count()).select_from(t))
        ]
        if held:
            raise TargetNotEmpty(
                f"the target database is not empty (rows in {', '.join(held)}); copy into an empty one"
            )
        for table in reversed(Base.metadata.sorted_tables):  # children first: rows the migrations seeded
            dst.execute(delete(table))
        for table in Base.metadata.sorted_tables:  # parents before children
            total = src.scalar(select(func.count()).select_from(table)) or 0
            done = 0
            rows = src.execute(select(table))
            while batch := rows.fetchmany(_BATCH):
                dst.execute(insert(table), [dict(r._mapping) for r in batch])
                done += len(batch)
                report(table.name, done, total)
            counts[table.name] = done
        if target.dialect.name == "postgresql":  # identity sequences continue after the copied ids
            for table in Base.metadata.sorted_tables:
                pk = list(table.primary_key.columns)
                if len(pk) == 1 and isinstance(pk[0].type, Integer) and pk[0].autoincrement is not False:
                    seq = dst.scalar(text("SELECT pg_get_serial_sequence(:t, :c)"), {"t": table.name, "c": pk[0].name})
                    if seq:
                        top = dst.scalar(select(func.max(pk[0])))
                        dst.execute(
                            text("SELECT setval(:s, :v, :called)"), {"s": seq, "v": top or 1, "called": bool(top)}
                        )
    log.info("copied %s", counts)
    return counts
