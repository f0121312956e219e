"""The index as SQL holds it: a replica (or an expert shard's part of one, or its lists without the
vectors) built from the stored clustering and embeddings, and the assignments a loaded replica is
checked against. Reads only."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.core.models import Chunk, Cluster, IndexState, stack
from index import ClusteredIndex, IndexCorrupt
from index.list_map import ListMap

Progress = Callable[[int, int], None]
_BATCH = 10_000


def assignments(s: Session) -> tuple[np.ndarray, np.ndarray]:
    """([N] chunk ids, [N] their lists), by chunk id."""
    rows = s.execute(select(Chunk.id, Chunk.cluster_id).order_by(Chunk.id)).all()
    ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    clusters = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
    return ids, clusters


def index_from_sql(
    s: Session,
    dim: int,
    lists: Callable[[int], np.ndarray] | None = None,
    progress: Progress | None = None,
    codec: str = "flat",
) -> ClusteredIndex:
    """The index of the stored clustering holding every chunk, or only the chunks of
    `lists(nlist)` (an expert shard's: app.shards.replicas), its vectors stored as `codec`; reads only."""
    state = s.get(IndexState, 1)
    if state is None:
        raise IndexCorrupt("no index state in the database")
    fresh = ClusteredIndex.create(_centroids(s, state.nlist, dim), state.version, codec)
    query = select(Chunk.id, Chunk.cluster_id, Chunk.embedding).order_by(Chunk.id)
    counted = select(func.count(Chunk.id))
    if lists is not None:
        wanted = lists(state.nlist).tolist()
        query, counted = query.where(Chunk.cluster_id.in_(wanted)), counted.where(Chunk.cluster_id.in_(wanted))
    total = s.scalar(counted) or 0
    done = 0
    for batch in s.execute(query).partitions(_BATCH):
        ids = np.fromiter((r[0] for r in batch), dtype=np.int64)
        clusters = np.fromiter((r[1] for r in batch), dtype=np.int64)
        fresh.add(stack((r[2] for r in batch), dim), ids, clusters)
        done += len(batch)
        if progress:
            progress(done, total)
    return fresh


def list_map_from_sql(s: Session, dim: int) -> ListMap:
    """The stored clustering's lists and every chunk's list, without the vectors (index.list_map)."""
    state = s.get(IndexState, 1)
    if state is None:
        raise IndexCorrupt("no index state in the database")
    ids, lists = assignments(s)
    return ListMap(_centroids(s, state.nlist, dim), state.version, ids, lists)


def _centroids(s: Session, nlist: int, dim: int) -> np.ndarray:
    rows = s.execute(select(Cluster.id, Cluster.centroid).order_by(Cluster.id)).all()
    if [r[0] for r in rows] != list(range(nlist)):
        raise RuntimeError(f"cluster table does not hold lists 0..{nlist - 1}; run `moerag recluster`")
    return stack((r[1] for r in rows), dim)
