"""Small free functions over the index log (see IndexManager; snapshots: app/services/snapshots.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from app.models import CatalogueChange, CatalogueVersion, Chunk, IndexLog, stack
from index import ClusteredIndex


@dataclass(frozen=True)
class LogSlice:
    """The index log between two catalogue versions, reduced to each chunk's last entry."""

    touched: list[int]  # every chunk with an entry: leaving, moving or entering
    ids: np.ndarray  # [N] chunks to (re-)enter that SQL still holds
    x: np.ndarray  # [N, D] their embeddings
    clusters: np.ndarray  # [N] their lists


def read_log(s: Session, after: int, upto: int, dim: int) -> LogSlice:
    rows = s.execute(
        select(IndexLog.chunk_id, IndexLog.cluster_id)
        .where(IndexLog.version > after, IndexLog.version <= upto)
        .order_by(IndexLog.version, IndexLog.chunk_id)
    ).all()
    latest: dict[int, int | None] = dict(rows)  # the last entry of each chunk wins
    entering = [c for c, k in latest.items() if k is not None]
    vectors: dict[int, np.ndarray] = {}
    for start in range(0, len(entering), 900):  # bounded IN lists
        batch = entering[start : start + 900]
        vectors.update(s.execute(select(Chunk.id, Chunk.embedding).where(Chunk.id.in_(batch))).all())
    present = [c for c in entering if c in vectors]  # a chunk deleted since is simply absent
    return LogSlice(
        list(latest),
        np.array(present, dtype=np.int64),
        stack((vectors[c] for c in present), dim),
        np.array([latest[c] for c in present], dtype=np.int64),
    )


def apply_log(index: ClusteredIndex, changes: LogSlice) -> None:
    """Idempotent: a chunk entering again moves, one leaving again is a no-op."""
    index.remove(changes.touched)  # leaving, and moving (absent ids are ignored)
    index.add(changes.x, changes.ids, changes.clusters)


def horizon(s: Session) -> int:
    """The newest version whose log was compacted away (0: none)."""
    return int(s.scalar(select(CatalogueVersion.log_horizon).where(CatalogueVersion.id == 1)) or 0)


def compact(s: Session, covered: int, retention_seconds: float) -> int:
    """Drop the index log and catalogue changes up to the newest version that is both covered by a
    snapshot (`covered`) and older than the retention: a live follower is never that far behind,
    and one that is (or a snapshot that old) rebuilds from SQL. Returns the horizon now."""
    cutoff = datetime.now(UTC) - timedelta(seconds=retention_seconds)
    old = s.scalar(select(func.max(CatalogueChange.version)).where(CatalogueChange.created_at < cutoff)) or 0
    target = min(int(old), covered)
    current = horizon(s)
    if target <= current:
        return current
    s.execute(update(CatalogueVersion).where(CatalogueVersion.id == 1).values(log_horizon=target))
    s.execute(delete(IndexLog).where(IndexLog.version <= target))
    s.execute(delete(CatalogueChange).where(CatalogueChange.version <= target))
    return target
