"""Content fit (index.fit) in the store: back-fill for stores clustered before it existed, and
the drift report: which documents' content fits no expert (it outgrew the experts)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from sqlalchemy import case, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from app.models import Chunk, Cluster, Document, Expert, stack
from app.services.indexing import IndexManager
from index.fit import fits, floors

log = logging.getLogger(__name__)

DRIFT_DOCUMENTS_SHOWN = 20  # documents named in the report; the counts cover all of them


def outside_fit() -> Any:
    """SQL: 1 where a chunk fits below its list's floor, else 0 (unknown fit or floor: 0)."""
    return case((Chunk.fit < Cluster.fit_floor, 1), else_=0)


class ContentFit:
    def __init__(self, sessions: sessionmaker[Session], indexes: IndexManager, version: Callable[[], int]) -> None:
        self.sessions, self.indexes, self.version = sessions, indexes, version
        self._drift: tuple[int, dict[str, Any]] | None = None  # (catalogue version, report)
        self._lock = threading.Lock()

    def backfill(self) -> int:
        """Fits and floors a store clustered before they were kept; returns the chunks filled."""
        indexes = self.indexes
        with indexes.write_lock:
            if indexes.index.nlist <= 1:
                return 0
            centroids = indexes.index.centroids()
            with self.sessions() as s:
                rows = s.execute(select(Chunk.id, Chunk.cluster_id, Chunk.embedding).where(Chunk.fit.is_(None))).all()
                floorless = s.scalar(select(func.count(Cluster.id)).where(Cluster.fit_floor.is_(None))) or 0
            if rows:
                lists = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
                fit = fits(stack((r[2] for r in rows), indexes.dim), centroids, lists)
                if fit is not None:
                    with self.sessions.begin() as s:
                        s.execute(
                            update(Chunk),
                            [{"id": int(r[0]), "fit": float(f)} for r, f in zip(rows, fit, strict=True)],
                        )
            if floorless:
                with self.sessions.begin() as s:
                    members = s.execute(select(Chunk.fit, Chunk.cluster_id).where(Chunk.fit.is_not(None))).all()
                    fit = np.fromiter((r[0] for r in members), dtype=np.float32, count=len(members))
                    lists = np.fromiter((r[1] for r in members), dtype=np.int64, count=len(members))
                    floor = floors(fit, lists, indexes.index.nlist)
                    s.execute(update(Cluster), [{"id": c, "fit_floor": float(f)} for c, f in enumerate(floor)])
        if rows or floorless:
            log.info("content fit filled in for %d chunks and %d lists", len(rows), floorless)
        return len(rows)

    def drift(self) -> dict[str, Any]:
        """Documents most of whose chunks fit no expert's lists (below the floor), once experts exist.

        -> {chunks, documents, shown: [{id, title, source, chunks, outside}], in words}; computed
        once per catalogue version.
        """
        version = self.version()
        cached = self._drift
        if cached is not None and cached[0] == version:
            return cached[1]
        with self._lock, self.sessions() as s:
            report = _drift(s)
        self._drift = (version, report)
        return report


def _drift(s: Session) -> dict[str, Any]:
    none = {"chunks": 0, "documents": 0, "shown": [], "summary": "every document fits an expert"}
    if (s.scalar(select(func.count(Expert.id))) or 0) == 0:
        return none | {"summary": "no experts yet"}
    outside = func.sum(outside_fit())
    per_document = (
        select(Chunk.document_id, func.count(Chunk.id).label("n"), outside.label("outside"))
        .join(Cluster, Cluster.id == Chunk.cluster_id)
        .group_by(Chunk.document_id)
        .having(2 * outside > func.count(Chunk.id))
        .subquery()
    )
    totals = s.execute(
        select(func.count(), func.coalesce(func.sum(per_document.c.outside), 0)).select_from(per_document)
    ).one()
    documents, chunks = int(totals[0]), int(totals[1])
    if not documents:
        return none
    shown = s.execute(
        select(Document.id, Document.title, Document.source, per_document.c.n, per_document.c.outside)
        .join(per_document, per_document.c.document_id == Document.id)
        .order_by(per_document.c.outside.desc(), Document.id)
        .limit(DRIFT_DOCUMENTS_SHOWN)
    ).all()
    return {
        "chunks": chunks,
        "documents": documents,
        "shown": [{"id": d, "title": t, "source": src, "chunks": n, "outside": o} for d, t, src, n, o in shown],
        "summary": f"content outgrew the experts: {chunks} chunks from {documents} documents fit no expert",
    }
