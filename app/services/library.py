"""Reading the stored documents and chunks: pages of documents, one document, one chunk."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload, sessionmaker

from app.models import Chunk, Document
from engine.errors import NotFound


def document_page(sessions: sessionmaker[Session], offset: int, limit: int) -> tuple[int, list[tuple[Document, int]]]:
    """(total documents, [(document, its chunk count)]) in id order from `offset`."""
    with sessions() as s:
        total = s.scalar(select(func.count(Document.id))) or 0
        counts = select(Chunk.document_id, func.count(Chunk.id).label("n")).group_by(Chunk.document_id).subquery()
        rows = s.execute(
            select(Document, func.coalesce(counts.c.n, 0))
            .outerjoin(counts, counts.c.document_id == Document.id)
            .order_by(Document.id)
            .offset(offset)
            .limit(limit)
        ).all()
    return total, [(doc, int(n)) for doc, n in rows]


def document(sessions: sessionmaker[Session], document_id: int) -> Document:
    """The document with its chunks loaded, in order."""
    with sessions() as s:
        doc = s.scalars(
            select(Document).options(selectinload(Document.chunks)).where(Document.id == document_id)
        ).first()
    if doc is None:
        raise NotFound(f"document {document_id} not found")
    return doc


def chunk(sessions: sessionmaker[Session], chunk_id: int) -> Chunk:
    """The chunk with its document loaded."""
    with sessions() as s:
        c = s.scalars(select(Chunk).options(selectinload(Chunk.document)).where(Chunk.id == chunk_id)).first()
    if c is None:
        raise NotFound(f"chunk {chunk_id} not found")
    return c
