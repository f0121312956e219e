"""Content fit (index.fit) in the store: back-fill for stores clustered before it existed, the new
topics (documents stored after the fitting whose fit lies below their expert's floor), and the
drift report: which documents' content fits no expert (it outgrew the experts)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from sqlalchemy import case, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from app.clustering.indexing import IndexManager
from app.core.models import Chunk, Cluster, Document, Expert, IndexState, cluster_owners, stack
from engine.topics import MIN_TOPIC_DOCUMENTS
from index.fit import document_fits_within, document_floors, fits, floors

log = logging.getLogger(__name__)

DRIFT_DOCUMENTS_SHOWN = 20  # documents named in the report; the counts cover all of them
# Drift calls for a re-fit ("outgrown") when the content that fits no expert could make an expert
# of its own (engine.topics.MIN_TOPIC_DOCUMENTS documents) or is this share of all chunks; less
# (one stray file) is reported, never raised.
DRIFT_SHARE = 0.10


def outside_fit() -> Any:
    """SQL: 1 where a chunk fits below its list's floor, else 0 (unknown fit or floor: 0)."""
    return case((Chunk.fit < Cluster.fit_floor, 1), else_=0)


class ContentFit:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        indexes: IndexManager,
        version: Callable[[], int],
        search_index: Callable[[], Any] | None = None,
    ) -> None:
        self.sessions, self.indexes, self.version = sessions, indexes, version
        # What document fits are measured on: the serving state's vectors (over shards too); None:
        # the replica's own (IndexManager.search_index).
        self.search_index = search_index or indexes.search_index
        self._drift: tuple[int, dict[str, Any]] | None = None  # (catalogue version, report)
        self._new: tuple[int, dict[int, float]] | None = None  # (catalogue version, new topics)
        self._floors: tuple[Any, dict[int, float]] | None = None  # ((watermark, mapping), expert floors)
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
            with self.sessions() as s:
                through = s.scalar(select(IndexState.fitted_through).where(IndexState.id == 1))
            documents = 0 if through is not None else self._backfill_documents()
        if rows or floorless or documents:
            log.info("content fit filled in for %d chunks, %d lists and %d documents", len(rows), floorless, documents)
        return len(rows)

    def _backfill_documents(self) -> int:
        """Everything stored now becomes the fitted content: each document's fit, leave-one-document-out."""
        index = self.search_index()
        with self.sessions() as s:
            rows = s.execute(select(Chunk.id, Chunk.document_id, Chunk.embedding).order_by(Chunk.id)).all()
        if not rows:
            return 0
        ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        documents = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
        fit = document_fits_within(index, stack((r[2] for r in rows), self.indexes.dim), ids, documents)
        with self.sessions.begin() as s:
            state = self.indexes.lock_clustering(s, index.version)
            s.execute(update(Document), [{"id": d, "fit": f} for d, f in fit.items()])
            state.fitted_through = int(ids.max())
        return len(fit)

    def new_topics(self) -> dict[int, float]:
        """{document: its fit minus its expert's floor} for the documents stored after the fitting
        (index.fit): below 0 a new topic. Computed once per catalogue version."""
        version = self.version()
        cached = self._new
        if cached is not None and cached[0] == version:
            return cached[1]
        with self._lock, self.sessions() as s:
            margins = _new_topics(s, self._floors_for)
        self._new = (version, margins)
        return margins

    def _floors_for(self, s: Session, through: int) -> dict[int, float]:
        """The experts' document floors, kept while the watermark and the list -> expert mapping
        stand (they read every fitted chunk: 0.1 s on 46k chunks)."""
        key = (through, tuple(cluster_owners(s).items()))
        cached = self._floors
        if cached is None or cached[0] != key:
            cached = self._floors = (key, _floors(s, through))
        return cached[1]

    def drift(self) -> dict[str, Any]:
        """Documents most of whose chunks fit no expert's lists (below the floor), once experts exist.

        -> {chunks, documents, shown: [{id, title, source, chunks, outside}], in words}; computed
        once per catalogue version.
        """
        version = self.version()
        cached = self._drift
        if cached is not None and cached[0] == version:
            return cached[1]
        new = [d for d, m in self.new_topics().items() if m < 0]
        with self._lock, self.sessions() as s:
            report = _drift(s, new)
        self._drift = (version, report)
        return report


def _experts_of(s: Session, chunks: Any) -> dict[int, int]:
    """{document: the expert holding most of its chunks} over the chunks matching `chunks`."""
    votes: dict[int, tuple[int, int]] = {}  # document -> (its expert, chunks there)
    per_expert = (
        select(Chunk.document_id, Cluster.expert_id, func.count(Chunk.id))
        .join(Cluster, Cluster.id == Chunk.cluster_id)
        .where(chunks)
        .group_by(Chunk.document_id, Cluster.expert_id)
    )
    for d, e, n in s.execute(per_expert):
        if e is not None and n > votes.get(d, (0, 0))[1]:
            votes[d] = (e, n)
    return {d: e for d, (e, _) in votes.items()}


def _floors(s: Session, through: int) -> dict[int, float]:
    """{expert: its document floor} over the fitted documents (index.fit `document_floors`)."""
    expert_of = _experts_of(s, Chunk.id <= through)
    fitted = select(Document.id, Document.fit).where(
        Document.id.in_(select(Chunk.document_id).where(Chunk.id <= through))
    )
    return document_floors({d: f for d, f in s.execute(fitted) if f is not None}, expert_of)


def _new_topics(s: Session, floors_for: Callable[[Session, int], dict[int, float]]) -> dict[int, float]:
    """{document stored after the fitting: its fit minus its expert's floor}; the floors from
    `floors_for(s, fitted_through)`. Reads only the chunks above the watermark, by primary key."""
    through = s.scalar(select(IndexState.fitted_through).where(IndexState.id == 1))
    if through is None:
        return {}
    expert_of = _experts_of(s, Chunk.id > through)  # a document's chunks are written together: all above
    if not expert_of:
        return {}
    floor = floors_for(s, through)
    fit = s.execute(
        select(Document.id, Document.fit).where(Document.id.in_(select(Chunk.document_id).where(Chunk.id > through)))
    )
    return {
        d: f - floor[e] for d, f in fit if f is not None and (e := expert_of.get(d)) is not None and e in floor
    }  # a document in lists no expert owns has no floor: it is on no expert's path


def _drift(s: Session, new: list[int]) -> dict[str, Any]:
    """The documents most of whose chunks fit below their lists' floors, and the `new` topics."""
    none = {"chunks": 0, "documents": 0, "shown": [], "meaningful": False, "summary": "every document fits an expert"}
    if (s.scalar(select(func.count(Expert.id))) or 0) == 0:
        return none | {"summary": "no experts yet"}
    outside = func.sum(outside_fit())
    below = (
        select(Chunk.document_id, func.count(Chunk.id), outside)
        .join(Cluster, Cluster.id == Chunk.cluster_id)
        .group_by(Chunk.document_id)
        .having(2 * outside > func.count(Chunk.id))
    )
    found: dict[int, tuple[int, int]] = {d: (int(n), int(o)) for d, n, o in s.execute(below)}  # (chunks, outside)
    if new:
        sizes = select(Chunk.document_id, func.count(Chunk.id)).where(Chunk.document_id.in_(new))
        for d, n in s.execute(sizes.group_by(Chunk.document_id)):
            found[d] = (int(n), int(n))  # a new topic: none of its chunks fits an expert
    if not found:
        return none
    documents, chunks = len(found), sum(o for _, o in found.values())
    first = sorted(found, key=lambda d: (-found[d][1], d))[:DRIFT_DOCUMENTS_SHOWN]
    about = {
        d: (t, src)
        for d, t, src in s.execute(select(Document.id, Document.title, Document.source).where(Document.id.in_(first)))
    }
    total = s.scalar(select(func.count(Chunk.id))) or 1
    meaningful = documents >= MIN_TOPIC_DOCUMENTS or chunks >= DRIFT_SHARE * total
    summary = f"content outgrew the experts: {chunks} chunks from {documents} documents fit no expert"
    if not meaningful:
        summary = (
            f"{documents} document(s) ({chunks} chunks) fit no expert: under {MIN_TOPIC_DOCUMENTS} documents and "
            f"{DRIFT_SHARE:.0%} of the chunks, too little for an expert of its own; the fallback answers them"
        )
    return {
        "chunks": chunks,
        "documents": documents,
        "meaningful": meaningful,
        "shown": [
            {"id": d, "title": about[d][0], "source": about[d][1], "chunks": found[d][0], "outside": found[d][1]}
            for d in first
            if d in about
        ],
        "summary": summary,
    }
