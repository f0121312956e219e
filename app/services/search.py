"""Dense search over the whole store or a set of clusters, resolved to chunk rows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload, sessionmaker

from app.core.limits import SEARCH_K, check_question
from app.core.models import Chunk
from app.core.settings import Settings
from app.schemas.api import SearchHit, SearchIn, SearchOut
from app.services.tokens import Principal, Tokens, reach
from engine.access import Allowed, scan_size
from engine.embedder import Embedder
from engine.serving import ServingState
from index.store import SearchIndex


class SearchParts(Protocol):
    """What a search takes of the service (app.runtime.Runtime is one): the settings, the database,
    the embedder, the serving state and the question as retrieval reads it under a state."""

    @property
    def settings(self) -> Settings: ...

    @property
    def sessions(self) -> sessionmaker[Session]: ...

    @property
    def embedder(self) -> Embedder: ...

    @property
    def tokens(self) -> Tokens: ...

    def state(self) -> ServingState: ...

    def retrieval_vector(self, state: ServingState) -> Callable[[np.ndarray], np.ndarray]: ...


@dataclass(frozen=True)
class Hit:
    chunk: Chunk
    score: float


@dataclass(frozen=True)
class SearchResult:
    hits: list[Hit]
    clusters_scanned: int
    vectors_scanned: int


def search(
    sessions: sessionmaker[Session],
    embedder: Embedder,
    index: SearchIndex,
    query: str,
    k: int,
    clusters: Sequence[int] | None,
    retrieval_vector: Callable[[np.ndarray], np.ndarray] | None = None,
    allowed: Allowed | None = None,
) -> SearchResult:
    """Each hit's chunk comes with its document loaded (usable after the session closed).
    retrieval_vector: the question as retrieval reads it (the active router's query adapter), as /ask does.
    allowed: what a scoped caller may read (engine.access): its chunks only are searched, before
    the top k, and counted as scanned."""
    # The question path /ask embeds with (no turn at the model: a large document embedding
    # meanwhile never delays a search; the same vectors as `encode`, checked at start).
    q = embedder.encode_questions([query])  # [1, D]
    q = retrieval_vector(q) if retrieval_vector is not None else q  # [1, D]
    scores, ids = index.search(q, k, clusters, allowed.id_set if allowed is not None else None)  # [1, K], [1, K]
    scanned_lists, scanned = scan_size(index, allowed, list(clusters) if clusters is not None else None)
    found = [(int(i), float(sc)) for i, sc in zip(ids[0], scores[0], strict=True) if i >= 0]
    with sessions() as s:
        rows = {
            c.id: c
            for c in s.scalars(
                select(Chunk).options(selectinload(Chunk.document)).where(Chunk.id.in_([i for i, _ in found]))
            )
        }
    # An id the index returns but SQL no longer has (a delete racing this search) is skipped.
    hits = [Hit(rows[i], sc) for i, sc in found if i in rows]
    return SearchResult(hits, scanned_lists, scanned)


def run_search(rt: SearchParts, body: SearchIn, who: Principal | None = None) -> SearchOut:
    """The search as `POST /search` answers it (the CLI's local `search` prints the same), within
    what `who` may read."""
    check_question(body.query, body.k, rt.settings)
    k = SEARCH_K if body.k is None else body.k
    state = rt.state()  # one version's index and router
    allowed = reach(rt.tokens, who, state)
    vector = rt.retrieval_vector(state)
    result = search(rt.sessions, rt.embedder, state.index, body.query, k, body.clusters, vector, allowed)
    hits = [
        SearchHit(
            chunk_id=h.chunk.id,
            document_id=h.chunk.document_id,
            source=h.chunk.document.source,
            title=h.chunk.document.title,
            heading=h.chunk.heading,
            cluster_id=h.chunk.cluster_id,
            score=h.score,
            text=h.chunk.text,
        )
        for h in result.hits
    ]
    return SearchOut(hits=hits, clusters_scanned=result.clusters_scanned, vectors_scanned=result.vectors_scanned)
