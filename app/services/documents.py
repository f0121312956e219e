"""Ingest, update and delete documents: parse -> chunk -> embed -> one transaction -> index."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.clustering.indexing import IndexManager, Placement
from app.core.models import Chunk, Document
from app.store import index_log
from engine.blocks import ParsedDocument
from engine.chunking import Chunk as TextChunk
from engine.chunking import ChunkingConfig, chunk_document
from engine.embedder import Embedder, Vectors
from engine.errors import Conflict, IndexMoved, InputError, NotFound, OutOfScope
from engine.parsing import parse

log = logging.getLogger(__name__)

# Chunks gathered across documents before one encode call: small documents alone would
# give the model tiny batches and waste most of its throughput.
EMBED_GROUP = 256
# An upload of at most this many chunks embeds in one urgent turn at the model; more, in
# background slices that let urgent callers go first (engine.turns).
URGENT_CHUNKS = 64


@dataclass
class Upload:
    data: bytes
    source: str
    filename: str | None = None
    title: str | None = None
    content_type: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def content_hash(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


Status = Literal["created", "duplicate", "updated", "unchanged", "failed"]


@dataclass
class Outcome:
    """What happened to one upload."""

    status: Status
    source: str
    document_id: int | None = None
    chunks: int = 0  # the document's chunks (a duplicate's: those already stored)
    error: InputError | None = None

    @property
    def added(self) -> int:
        """Chunks this upload added to the store (none for a duplicate)."""
        return 0 if self.status == "duplicate" else self.chunks


class WriteScope(Protocol):
    """What a scoped writer may write (app.services.tokens.Scope): documents by their own source
    and metadata. Outside it, an existing document is not found and a new one is refused."""

    def admits(self, source: str, meta: Mapping[str, Any] | None) -> bool: ...

    @property
    def writes(self) -> str: ...


def refuse_outside(
    scope: WriteScope | None, source: str, meta: Mapping[str, Any] | None, named: str = "this document"
) -> None:
    """OutOfScope unless a document of this source and metadata lies in `scope` (None: any does)."""
    if scope is not None and not scope.admits(source, meta):
        raise OutOfScope(f"this token writes {scope.writes}; {named} would not be one")


def _not_found_outside(scope: WriteScope | None, doc: Document | None, document_id: int) -> Document:
    """The document, if it exists and `scope` may write it; else not found, as one that does not exist."""
    if doc is None or (scope is not None and not scope.admits(doc.source, doc.meta)):
        raise NotFound(f"document {document_id} not found")
    return doc


@dataclass
class _Prepared:
    upload: Upload
    content_hash: str
    parsed: ParsedDocument
    chunks: list[TextChunk]


@dataclass
class Ingestor:
    sessions: Callable[[], Session]
    embedder: Embedder
    indexes: IndexManager
    chunking: ChunkingConfig
    follow: Callable[[], object] = lambda: None  # apply the catalogue's changes now (Catalogue.sync)
    # What a new document's fit is measured on (app.serving.states.ServingStates.search_index:
    # the replica, or its lists over the shards); None: the replica's own search_index.
    search_index: Callable[[], Any] | None = None

    # ---- shared steps -------------------------------------------------------------------------

    def _search(self) -> Any:
        return self.search_index() if self.search_index is not None else None

    def _prepare(self, upload: Upload) -> _Prepared:
        parsed = parse(upload.data, upload.filename, upload.content_type, ocr_pages=self.chunking.max_ocr_pages)
        chunks = chunk_document(parsed, self.embedder.count_tokens, self.chunking)
        return _Prepared(upload, upload.content_hash, parsed, chunks)

    def _embed(self, batch: list[_Prepared]) -> list[Vectors]:
        texts = [c.embed_text for p in batch for c in p.chunks]
        # Many chunks embed in background slices: small uploads and searches go between them.
        vectors = self.embedder.encode(texts, background=len(texts) > URGENT_CHUNKS)  # [N, D]
        out, pos = [], 0
        for p in batch:
            out.append(vectors[pos : pos + len(p.chunks)])
            pos += len(p.chunks)
        return out

    def _chunk_rows(self, p: _Prepared, vectors: Vectors, placed: Placement, document_id: int) -> list[Chunk]:
        clusters, fit = placed.lists, placed.fits
        return [
            Chunk(
                document_id=document_id,
                ordinal=c.ordinal,
                text=c.text,
                heading=c.heading,
                char_start=c.start,
                char_end=c.end,
                token_count=c.token_count,
                cluster_id=int(cl),
                embedding=v,
                fit=f,
            )
            for c, v, cl, f in zip(p.chunks, vectors, clusters, fit, strict=True)
        ]

    def _duplicate(self, content_hash: str) -> Outcome | None:
        """The stored document with these bytes, as a `duplicate` outcome with its chunk count."""
        with self.sessions() as s:
            doc = s.scalars(select(Document).where(Document.content_hash == content_hash)).first()
            if doc is None:
                return None
            n = s.scalar(select(func.count(Chunk.id)).where(Chunk.document_id == doc.id)) or 0
            return Outcome("duplicate", doc.source, doc.id, n)

    # ---- create ---------------------------------------------------------------------------------

    def _commit_new(self, p: _Prepared, vectors: Vectors) -> Outcome:
        for _ in range(3):  # another process reclustered meanwhile: follow it, place again
            try:
                return self._try_commit_new(p, vectors)
            except IndexMoved:  # this replica has not seen the new clustering yet: follow it now
                self.follow()
        return self._try_commit_new(p, vectors)

    def _try_commit_new(self, p: _Prepared, vectors: Vectors) -> Outcome:
        up = p.upload
        with self.indexes.write_lock:
            placement = self.indexes.place_document(vectors, up.source, up.metadata, search=self._search())
            clusters = placement.lists
            placed = self.indexes.index.version
            try:
                with self.sessions() as s, s.begin():
                    self.indexes.lock_clustering(s, placed)
                    title = up.title or p.parsed.title or up.filename or up.source
                    doc = Document(
                        source=up.source,
                        title=title[:1024],
                        mime=p.parsed.mime,
                        content_hash=p.content_hash,
                        size=len(up.data),
                        status="ready",
                        meta=up.metadata,
                        fit=placement.document_fit,
                    )
                    s.add(doc)
                    s.flush()
                    rows = self._chunk_rows(p, vectors, placement, doc.id)
                    s.add_all(rows)
                    s.flush()
                    ids = np.array([r.id for r in rows], dtype=np.int64)
                    index_log.stage(s, zip(ids.tolist(), clusters.tolist(), strict=True))
                    doc_id = doc.id
            except IntegrityError:
                # The same bytes arrived concurrently (or twice in one batch): the first one wins.
                existing = self._duplicate(p.content_hash)
                if existing is None:
                    raise
                return existing
        return Outcome("created", up.source, doc_id, len(ids))

    def ingest(self, upload: Upload, scope: WriteScope | None = None) -> Outcome:
        """One document; bad input raises InputError and writes nothing. `scope`: a scoped writer's,
        which the document must lie in; the same bytes stored outside it are a conflict that names
        nothing of that document."""
        refuse_outside(scope, upload.source, upload.metadata)
        outcome = next(self.ingest_many([lambda: upload]))
        error = outcome.error or self.stored_outside(outcome, scope)
        if error is not None:
            raise error
        return outcome

    def stored_outside(self, outcome: Outcome, scope: WriteScope | None) -> Conflict | None:
        """For a scoped writer's upload whose bytes were stored already, in a document outside its
        scope: the conflict, naming nothing of that document. None otherwise."""
        if scope is None or outcome.status != "duplicate":
            return None
        with self.sessions() as s:
            doc = s.get(Document, outcome.document_id)
            if doc is None or scope.admits(doc.source, doc.meta):
                return None
        return Conflict("the store holds these bytes already, outside this token's scope: nothing was stored")

    def ingest_many(self, uploads: Iterable[Callable[[], Upload]]) -> Iterator[Outcome]:
        """Many documents, embedded in groups; yields one outcome per upload, in order.

        Each upload is a thunk so a bulk job reads one file at a time, not all of them at once.
        """
        pending: list[_Prepared] = []
        queued: list[Outcome | _Prepared] = []
        n_pending_chunks = 0

        def flush() -> Iterator[Outcome]:
            nonlocal n_pending_chunks
            vectors = iter(self._embed(pending)) if pending else iter(())
            for item in queued:
                yield self._commit_new(item, next(vectors)) if isinstance(item, _Prepared) else item
            pending.clear()
            queued.clear()
            n_pending_chunks = 0

        for make in uploads:
            try:
                upload = make()
            except InputError as exc:
                queued.append(Outcome("failed", "", error=exc))
                continue
            existing = self._duplicate(upload.content_hash)
            if existing is not None:
                queued.append(existing)
            else:
                try:
                    prepared = self._prepare(upload)
                except InputError as exc:
                    queued.append(Outcome("failed", upload.source, error=exc))
                else:
                    pending.append(prepared)
                    queued.append(prepared)
                    n_pending_chunks += len(prepared.chunks)
            if n_pending_chunks >= EMBED_GROUP:
                yield from flush()
        yield from flush()

    # ---- update and delete ------------------------------------------------------------------------

    def update(self, document_id: int, upload: Upload, scope: WriteScope | None = None) -> Outcome:
        """New content, same id: old chunks leave SQL and the index log in the transaction new ones
        enter. `scope`: a scoped writer's; the document must lie in it, before and after."""
        with self.sessions() as s:
            doc = _not_found_outside(scope, s.get(Document, document_id), document_id)
            if doc.content_hash == upload.content_hash:
                n = len(doc.chunks)
                return Outcome("unchanged", doc.source, doc.id, n)
            source, meta = upload.source or doc.source, upload.metadata or doc.meta
        refuse_outside(scope, source, meta)
        other = self._duplicate(upload.content_hash)
        if other is not None:
            named = f"document {other.document_id}" if scope is None else "another document"
            raise Conflict(f"{named} already has exactly this content")
        prepared = self._prepare(upload)
        vectors = self._embed([prepared])[0]
        with self.indexes.write_lock:
            placement = self.indexes.place_document(vectors, source, meta, document_id, search=self._search())
            clusters = placement.lists
            with self.sessions() as s, s.begin():
                self.indexes.lock_clustering(s, self.indexes.index.version)
                doc = _not_found_outside(scope, s.get(Document, document_id), document_id)
                old_ids = list(s.scalars(select(Chunk.id).where(Chunk.document_id == document_id)))
                s.execute(delete(Chunk).where(Chunk.document_id == document_id))
                doc.content_hash, doc.size, doc.mime = (
                    prepared.content_hash,
                    len(upload.data),
                    prepared.parsed.mime,
                )
                doc.title = (upload.title or prepared.parsed.title or doc.title)[:1024]
                if upload.source:
                    doc.source = upload.source
                if upload.metadata:
                    doc.meta = upload.metadata
                doc.fit = placement.document_fit
                rows = self._chunk_rows(prepared, vectors, placement, document_id)
                s.add_all(rows)
                s.flush()
                ids = np.array([r.id for r in rows], dtype=np.int64)
                index_log.stage(s, zip(ids.tolist(), clusters.tolist(), strict=True), removed=old_ids)
                source = doc.source
        return Outcome("updated", source, document_id, len(ids))

    def delete(self, document_id: int, scope: WriteScope | None = None) -> int:
        """Remove a document (`scope`: a scoped writer's, which it must lie in); returns how many
        chunks left SQL and the index."""
        with self.indexes.write_lock, self.sessions() as s, s.begin():
            self.indexes.lock_clustering(s)
            doc = _not_found_outside(scope, s.get(Document, document_id), document_id)
            ids = list(s.scalars(select(Chunk.id).where(Chunk.document_id == document_id)))
            s.execute(delete(Chunk).where(Chunk.document_id == document_id))
            s.delete(doc)
            index_log.stage(s, removed=ids)
        return len(ids)
