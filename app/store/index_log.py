"""The index log: which chunks entered, moved or left the index at each catalogue version.

This module owns it, end to end:

    stage    a writer records, in its transaction, chunks entering (with their list) and leaving
    write    the catalogue's commit hook writes them with the version the commit bumps
    read     a follower reads the slice between the version it holds and the catalogue's
    apply    ... and applies it to its replica (the whole index, or an expert shard's share)
    compact  the snapshot writer drops what a snapshot covers, past a retention

A replica the log cannot carry (its clustering was replaced, or the log was compacted past the
version it holds: `carries` is false) is rebuilt from SQL instead. Snapshots:
app/store/snapshots.py; the replica that follows: app/clustering/indexing.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.orm import Session

from app.core.models import CatalogueChange, CatalogueVersion, Chunk, IndexLog, IndexState, stack
from index import ClusteredIndex
from index.list_map import ListMap

_STAGED = "moerag_index_log"  # session.info key: {chunk id: cluster id, or None when it leaves}
PART = "documents"  # the catalogue part a staged change belongs to


def stage(session: Session, added: Iterable[tuple[int, int]] = (), removed: Iterable[int] = ()) -> None:
    """Record, in this transaction, chunks entering the index ((chunk id, cluster id); a chunk
    already there moves) and chunks leaving it. The log rows are written at commit with the
    version the commit bumps; every process, this one included, applies them from the log."""
    staged: dict[int, int | None] = session.info.setdefault(_STAGED, {})
    for chunk_id in removed:
        staged[int(chunk_id)] = None
    for chunk_id, cluster_id in added:
        staged[int(chunk_id)] = int(cluster_id)


def staged(session: Session) -> bool:
    return bool(session.info.get(_STAGED))


def write(session: Session, version: int) -> None:
    """At commit (app.store.catalogue): the staged changes as log rows of `version`."""
    changes = session.info.pop(_STAGED, None)
    if changes:
        rows = [{"version": version, "chunk_id": c, "cluster_id": k} for c, k in sorted(changes.items())]
        session.execute(insert(IndexLog), rows)


def discard(session: Session) -> None:
    """At rollback: nothing staged is written."""
    session.info.pop(_STAGED, None)


@dataclass(frozen=True)
class LogSlice:
    """The index log between two catalogue versions, reduced to each chunk's last entry."""

    touched: list[int]  # every chunk with an entry: leaving, moving or entering
    ids: np.ndarray  # [N] chunks to (re-)enter that SQL still holds
    x: np.ndarray  # [N, D] their embeddings
    clusters: np.ndarray  # [N] their lists


def read_log(s: Session, after: int, upto: int, dim: int, vectors: bool = True) -> LogSlice:
    """The log in (after, upto]; `vectors=False`: the entering chunks' lists alone (their `x` empty)."""
    rows = s.execute(
        select(IndexLog.chunk_id, IndexLog.cluster_id)
        .where(IndexLog.version > after, IndexLog.version <= upto)
        .order_by(IndexLog.version, IndexLog.chunk_id)
    ).all()
    latest: dict[int, int | None] = dict(rows)  # the last entry of each chunk wins
    entering = [c for c, k in latest.items() if k is not None]
    found: dict[int, Any] = {}  # chunk id -> its embedding (or its id)
    column = Chunk.embedding if vectors else Chunk.id
    for start in range(0, len(entering), 900):  # bounded IN lists
        batch = entering[start : start + 900]
        found.update(s.execute(select(Chunk.id, column).where(Chunk.id.in_(batch))).all())
    present = [c for c in entering if c in found]  # a chunk deleted since is simply absent
    return LogSlice(
        list(latest),
        np.array(present, dtype=np.int64),
        stack((found[c] for c in present), dim) if vectors else np.zeros((len(present), 0), dtype=np.float32),
        np.array([latest[c] for c in present], dtype=np.int64),
    )


def apply_log(index: ClusteredIndex | ListMap, changes: LogSlice) -> None:
    """Idempotent: a chunk entering again moves, one leaving again is a no-op."""
    index.remove(changes.touched)  # leaving, and moving (absent ids are ignored)
    index.add(changes.x, changes.ids, changes.clusters)


def carries(s: Session, clustering: str, position: int) -> bool:
    """Whether the log can bring a replica of `clustering` at `position` to now: the clustering is
    still live and nothing after `position` was compacted away."""
    live = s.scalar(select(IndexState.version).where(IndexState.id == 1))
    return live == clustering and position >= horizon(s)


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
