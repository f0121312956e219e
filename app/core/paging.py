"""One way to page a list: the total that match and one slice of rows, from one statement."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, Select, func, select
from sqlalchemy.orm import Session

AnySelect = Select[*tuple[Any, ...]]


def page(
    s: Session, stmt: AnySelect, offset: int = 0, limit: int | None = None
) -> tuple[int, Sequence[Row[*tuple[Any, ...]]]]:
    """(rows matching `stmt`, rows `offset`..`offset + limit` in its order; no limit: all of them)."""
    total = s.scalar(select(func.count()).select_from(stmt.order_by(None).subquery())) or 0
    return total, s.execute(stmt.offset(offset).limit(limit)).all()


def scalar_page(s: Session, stmt: AnySelect, offset: int = 0, limit: int | None = None) -> tuple[int, list[Any]]:
    """`page` for a statement that selects one entity or column: its values, not rows."""
    total, rows = page(s, stmt, offset, limit)
    return total, [r[0] for r in rows]
