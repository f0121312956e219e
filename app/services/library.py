"""Reading the stored documents and chunks: pages of documents, one document, one chunk."""

from __future__ import annotations

import numpy as np
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session, selectinload, sessionmaker

from app.core.models import Chunk, Cluster, Document
from app.core.paging import page
from app.schemas.api import ChunkNeighbour, ChunkOut, ChunkSummary
from engine.access import Allowed
from engine.errors import NotFound


def document_page(
    sessions: sessionmaker[Session], offset: int, limit: int, text: str | None = None, allowed: Allowed | None = None
) -> tuple[int, list[tuple[Document, int]]]:
    """(documents matching, [(document, its chunk count)]) in id order from `offset`.

    `text`: only documents whose title or source contains it, or one of whose chunks does
    (case-insensitive substring; `%` and `_` are plain characters). `allowed`: a scoped caller's
    reach (engine.access): only documents with chunks in it, counting those chunks only.
    """
    counts = select(Chunk.document_id, func.count(Chunk.id).label("n")).group_by(Chunk.document_id).subquery()
    stmt = (
        select(Document, func.coalesce(counts.c.n, 0))
        .outerjoin(counts, counts.c.document_id == Document.id)
        .order_by(Document.id)
    )
    if text:
        in_chunks = select(Chunk.document_id).where(Chunk.text.icontains(text, autoescape=True))
        stmt = stmt.where(
            or_(
                Document.title.icontains(text, autoescape=True),
                Document.source.icontains(text, autoescape=True),
                Document.id.in_(in_chunks),
            )
        )
    if allowed is not None:
        stmt = stmt.where(Document.id.in_(sorted(allowed.documents)))
    with sessions() as s:
        total, rows = page(s, stmt, offset, limit)
    if allowed is not None:
        return total, [(doc, allowed.documents[doc.id]) for doc, _ in rows]
    return total, [(doc, int(n)) for doc, n in rows]


def document(
    sessions: sessionmaker[Session], document_id: int, allowed: Allowed | None = None
) -> tuple[Document, list[Chunk]]:
    """The document and its chunks, in order (a scoped caller's: those in its reach; a document
    with none is not found, in the same words as one that does not exist)."""
    if allowed is not None and document_id not in allowed.documents:
        raise NotFound(f"document {document_id} not found")
    with sessions() as s:
        doc = s.scalars(
            select(Document).options(selectinload(Document.chunks)).where(Document.id == document_id)
        ).first()
    if doc is None:
        raise NotFound(f"document {document_id} not found")
    chunks = list(doc.chunks)
    if allowed is not None:
        keep = allowed.contains(np.array([c.id for c in chunks], dtype=np.int64))
        chunks = [c for c, k in zip(chunks, keep, strict=True) if k]
    return doc, chunks


def chunk(
    sessions: sessionmaker[Session], chunk_id: int, allowed: Allowed | None = None
) -> tuple[Chunk, list[Chunk], int | None]:
    """The chunk with its document loaded, its neighbours in the document (the chunks just
    before and after it, in order) and the expert its cluster maps to; for a scoped caller, only
    within its reach (a chunk outside it is not found, in the same words as one that does not exist)."""
    if allowed is not None and not allowed.contains(np.array([chunk_id], dtype=np.int64))[0]:
        raise NotFound(f"chunk {chunk_id} not found")
    with sessions() as s:
        c = s.scalars(select(Chunk).options(selectinload(Chunk.document)).where(Chunk.id == chunk_id)).first()
        if c is None:
            raise NotFound(f"chunk {chunk_id} not found")
        neighbours = list(
            s.scalars(
                select(Chunk)
                .where(Chunk.document_id == c.document_id, Chunk.ordinal.in_((c.ordinal - 1, c.ordinal + 1)))
                .order_by(Chunk.ordinal)
            )
        )
        expert = s.scalar(select(Cluster.expert_id).where(Cluster.id == c.cluster_id))
    if allowed is not None:
        keep = allowed.contains(np.array([n.id for n in neighbours], dtype=np.int64))
        neighbours = [n for n, k in zip(neighbours, keep, strict=True) if k]
        expert = expert if expert in allowed.experts else None
    return c, neighbours, expert


def chunk_view(sessions: sessionmaker[Session], chunk_id: int, allowed: Allowed | None = None) -> ChunkOut:
    """`GET /chunks/{id}`'s body: the chunk in full, its place and its neighbours (within `allowed`)."""
    c, neighbours, expert_id = chunk(sessions, chunk_id, allowed)
    around = {n.ordinal - c.ordinal: ChunkNeighbour.model_validate(n) for n in neighbours}
    return ChunkOut(
        **ChunkSummary.model_validate(c).model_dump(),
        document_id=c.document_id,
        source=c.document.source,
        title=c.document.title,
        text=c.text,
        expert_id=expert_id,
        previous=around.get(-1),
        next=around.get(1),
    )
