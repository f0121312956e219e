"""Clusters (the index's lists) as the console and API see them: sizes, samples, a 2-D map."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from app.core.models import Chunk, Cluster, Document, stack
from app.core.paging import scalar_page
from app.services.experts import assign_clusters
from engine.errors import NotFound


@dataclass(frozen=True)
class ClusterRow:
    id: int
    size: int
    keywords: list[str]
    expert_id: int | None


@dataclass(frozen=True)
class ClusterSampleRow:
    chunk_id: int
    document_id: int
    source: str
    text: str


def sizes(sessions: sessionmaker[Session]) -> dict[int, int]:
    """Chunks per cluster id (clusters without chunks are absent)."""
    with sessions() as s:
        counts = s.execute(select(Chunk.cluster_id, func.count(Chunk.id)).group_by(Chunk.cluster_id))
        return {cluster: n for cluster, n in counts}


def list_clusters(
    sessions: sessionmaker[Session], offset: int = 0, limit: int | None = None
) -> tuple[int, list[ClusterRow]]:
    """(clusters in all, one page of them in id order)."""
    size = sizes(sessions)
    stmt = select(Cluster).order_by(Cluster.id)
    with sessions() as s:
        total, rows = scalar_page(s, stmt, offset, limit)
        return total, [ClusterRow(c.id, size.get(c.id, 0), list(c.keywords or []), c.expert_id) for c in rows]


def assign(sessions: sessionmaker[Session], cluster_id: int, expert_id: int | None) -> ClusterRow:
    """Map one cluster to an expert (None: unmap) and read it back in the same transaction: a
    recluster committed meanwhile cannot remove it between the two (NotFound for an unknown id)."""
    with sessions.begin() as s:
        assign_clusters(s, [cluster_id], expert_id)
        c = s.get(Cluster, cluster_id)
        if c is None:  # not reached: assign_clusters holds the write lock and found it
            raise NotFound(f"cluster {cluster_id} not found")
        size = s.scalar(select(func.count(Chunk.id)).where(Chunk.cluster_id == cluster_id)) or 0
        return ClusterRow(c.id, size, list(c.keywords or []), c.expert_id)


def cluster_detail(
    sessions: sessionmaker[Session], cluster_id: int, samples: int
) -> tuple[ClusterRow, list[ClusterSampleRow]]:
    """The cluster and its first `samples` chunks; NotFound for an unknown id."""
    with sessions() as s:
        c = s.get(Cluster, cluster_id)
        if c is None:
            raise NotFound(f"cluster {cluster_id} not found")
        size = s.scalar(select(func.count(Chunk.id)).where(Chunk.cluster_id == cluster_id)) or 0
        rows = s.execute(
            select(Chunk.id, Chunk.document_id, Document.source, Chunk.text)
            .join(Document, Document.id == Chunk.document_id)
            .where(Chunk.cluster_id == cluster_id)
            .order_by(Chunk.id)
            .limit(samples)
        ).all()
        row = ClusterRow(c.id, size, list(c.keywords or []), c.expert_id)
    return row, [ClusterSampleRow(*r) for r in rows]


def cluster_map(sessions: sessionmaker[Session]) -> list[dict[str, Any]]:
    """A 2-D projection (PCA) of the cluster centroids: id, x, y, size, expert_id, keywords per cluster."""
    size = sizes(sessions)
    with sessions() as s:
        rows = s.execute(
            select(Cluster.id, Cluster.centroid, Cluster.expert_id, Cluster.keywords).order_by(Cluster.id)
        ).all()
    if not rows:
        return []
    c = stack((r[1] for r in rows), len(rows[0][1]))  # [C, D]
    centred = c - c.mean(axis=0)  # [C, D]
    if len(rows) > 1:
        _, _, vt = np.linalg.svd(centred, full_matrices=False)
        xy = centred @ vt[:2].T  # [C, <=2]
    else:
        xy = np.zeros((1, 2))
    if xy.shape[1] < 2:
        xy = np.pad(xy, ((0, 0), (0, 2 - xy.shape[1])))  # [C, 2]
    return [
        {
            "id": r[0],
            "x": float(p[0]),
            "y": float(p[1]),
            "size": size.get(r[0], 0),
            "expert_id": r[2],
            "keywords": list(r[3] or [])[:5],
        }
        for r, p in zip(rows, xy, strict=True)
    ]
