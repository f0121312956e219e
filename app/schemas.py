"""Request and response bodies of the REST API."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class TextDocumentIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1)
    title: str | None = Field(None, max_length=1024)
    source: str | None = Field(None, max_length=1024)
    format: Literal["txt", "md", "html"] = "txt"
    metadata: dict[str, Any] = Field(default_factory=dict)


class IngestOut(BaseModel):
    id: int
    source: str
    chunks: int
    status: Literal["created", "duplicate", "updated", "unchanged", "failed"]


class DocumentOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    source: str
    title: str
    mime: str
    size: int
    status: str
    chunks: int
    metadata: dict[str, Any]
    content_hash: str
    created_at: datetime
    updated_at: datetime


class ChunkSummary(BaseModel):
    id: int
    ordinal: int
    heading: str
    token_count: int
    cluster_id: int
    char_start: int
    char_end: int


class DocumentDetail(DocumentOut):
    chunk_list: list[ChunkSummary] = Field(default_factory=list)


class DocumentPage(BaseModel):
    items: list[DocumentOut]
    total: int
    offset: int
    limit: int


class ChunkOut(ChunkSummary):
    document_id: int
    source: str
    title: str
    text: str


class DeletedOut(BaseModel):
    id: int
    deleted: bool
    chunks: int


class JobOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    kind: str
    status: str
    done: int
    total: int
    error: str | None
    result: dict[str, Any]
    created_at: datetime
    updated_at: datetime


class SearchIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=4000)
    k: int = Field(10, ge=1, le=200)
    clusters: list[int] | None = Field(None, description="Scan only these clusters; null scans all.")


class SearchHit(BaseModel):
    chunk_id: int
    document_id: int
    source: str
    title: str
    heading: str
    cluster_id: int
    score: float
    text: str


class SearchOut(BaseModel):
    hits: list[SearchHit]
    clusters_scanned: int
    vectors_scanned: int


class ClusterOut(BaseModel):
    id: int
    size: int
    keywords: list[str]
    expert_id: int | None


class StatsOut(BaseModel):
    documents: int
    chunks: int
    clusters: int
    index_vectors: int
