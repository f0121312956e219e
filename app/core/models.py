"""SQL is the source of truth; the FAISS index is derived from these rows."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    false,
    select,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

# SQLite only auto-increments an INTEGER PRIMARY KEY; BIGINT elsewhere.
BigId = BigInteger().with_variant(Integer(), "sqlite")

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_name)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


FloatVector = npt.NDArray[np.float32]


class Vector(TypeDecorator[FloatVector]):
    """A float32 vector [D] stored as raw bytes; reads come back as a read-only array.

    The one place that turns blobs into vectors: columns of this type (chunk embeddings,
    cluster centroids) bind any float array and read `FloatVector`s; `stack` makes [N, D].
    """

    impl = LargeBinary
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> bytes | None:
        if value is None:
            return None
        return np.ascontiguousarray(value, dtype=np.float32).tobytes()

    def process_result_value(self, value: bytes | None, dialect: Dialect) -> FloatVector | None:
        return None if value is None else np.frombuffer(value, dtype=np.float32)


def stack(vectors: Iterable[FloatVector], dim: int) -> FloatVector:
    """[N, dim] float32 from N vectors read from a `Vector` column ([0, dim] when there are none)."""
    rows = list(vectors)
    return np.vstack(rows).astype(np.float32, copy=False) if rows else np.zeros((0, dim), dtype=np.float32)


def never_reused() -> dict[str, Any]:
    """Table options for an id that leaves the server: SQLite hands out a deleted row's id again
    unless the table is AUTOINCREMENT (PostgreSQL's sequences never do). Migration 0006."""
    return {"sqlite_autoincrement": True}


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Document(Base):
    __tablename__ = "document"
    __table_args__ = never_reused()

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    source: Mapped[str] = mapped_column(String(1024), index=True)
    title: Mapped[str] = mapped_column(String(1024), default="")
    mime: Mapped[str] = mapped_column(String(64))
    content_hash: Mapped[str] = mapped_column(String(64), unique=True)
    size: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16), default="ready")
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    # Median cosine of its chunks to the nearest other document's chunk among the fitted content
    # (index.fit; None: unknown). Fitted documents are measured leave-one-document-out.
    fit: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)

    chunks: Mapped[list[Chunk]] = relationship(
        back_populates="document",
        cascade="all, delete-orphan",
        passive_deletes=True,
        order_by="Chunk.ordinal",
    )


class Chunk(Base):
    __tablename__ = "chunk"
    __table_args__ = never_reused()  # a deleted chunk's id (= its FAISS id) never comes back

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    document_id: Mapped[int] = mapped_column(ForeignKey("document.id", ondelete="CASCADE"), index=True)
    ordinal: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    heading: Mapped[str] = mapped_column(Text, default="")
    char_start: Mapped[int] = mapped_column(Integer)
    char_end: Mapped[int] = mapped_column(Integer)
    token_count: Mapped[int] = mapped_column(Integer)
    cluster_id: Mapped[int] = mapped_column(Integer, index=True)
    embedding: Mapped[FloatVector] = mapped_column(Vector)  # [D], so the index rebuilds without the model
    fit: Mapped[float | None] = mapped_column(Float, nullable=True)  # cosine to its list's centroid (index.fit)

    document: Mapped[Document] = relationship(back_populates="chunks")


class Expert(Base):
    __tablename__ = "expert"
    __table_args__ = never_reused()

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    system_prompt: Mapped[str] = mapped_column(Text, default="")
    generator: Mapped[str] = mapped_column(String(200), default="")  # "": the server's default
    top_k: Mapped[int] = mapped_column(Integer, default=5)
    threshold: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Defined by documents (app.clustering.expert_documents): {"ids", "source_prefix", "tag"}; None: by clusters.
    documents: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # The team's (named, edited, defined, mapped or accepted by an operator): no automatic action
    # deletes, renames or merges it, or moves its documents (docs/decisions/expert-ownership.md).
    owned: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Its model ids' tails, the current one first: a rename keeps the old ones answering (/v1).
    slugs: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Cluster(Base):
    """One inverted list of the current index version."""

    __tablename__ = "cluster"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    centroid: Mapped[FloatVector] = mapped_column(Vector)  # [D]
    keywords: Mapped[list[str]] = mapped_column(JSON, default=list)
    fit_floor: Mapped[float | None] = mapped_column(Float, nullable=True)  # below it a chunk fits no expert
    expert_id: Mapped[int | None] = mapped_column(
        ForeignKey("expert.id", ondelete="SET NULL"), nullable=True, index=True
    )


class IndexState(Base):
    """Which clustering the index file must match (a single row, id 1)."""

    __tablename__ = "index_state"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    version: Mapped[str] = mapped_column(String(64))
    nlist: Mapped[int] = mapped_column(Integer)
    dim: Mapped[int] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(200))
    # Chunks with an id up to this are the content the lists and experts were fitted on (ids grow).
    fitted_through: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)


class Job(Base):
    __tablename__ = "job"
    __table_args__ = never_reused()

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16), default="queued", index=True)
    done: Mapped[int] = mapped_column(Integer, default=0)
    total: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    result: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)
    owner: Mapped[str | None] = mapped_column(String(200), nullable=True)  # the scoped token that submitted it


class RouterVersion(Base):
    """A trained gate: weights, calibration and the metrics it was accepted on."""

    __tablename__ = "router_version"
    __table_args__ = never_reused()

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    weights: Mapped[bytes] = mapped_column(LargeBinary)  # torch state_dict
    dim: Mapped[int] = mapped_column(Integer)
    hidden: Mapped[int] = mapped_column(Integer)
    expert_ids: Mapped[list[int]] = mapped_column(JSON)  # output position -> expert id; last = none
    temperature: Mapped[float] = mapped_column(Float)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    active: Mapped[bool] = mapped_column(Boolean, default=False, index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ExpertsVersion(Base):
    """The experts and their mapping as they were before one change (app.clustering.expert_history):
    undo restores them, with the clustering and the router version active then."""

    __tablename__ = "experts_version"
    __table_args__ = never_reused()

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    action: Mapped[str] = mapped_column(String(40))  # refit, propose, map, define, delete, ...
    summary: Mapped[str] = mapped_column(Text, default="")
    experts: Mapped[list[dict[str, Any]]] = mapped_column(JSON)  # every expert's row
    clusters: Mapped[list[dict[str, Any]]] = mapped_column(JSON)  # id, expert_id, keywords, fit_floor
    index_version: Mapped[str] = mapped_column(String(64))
    router_version_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # npz of centroids [C, D], chunk ids [N] and their lists [N]: the clustering itself, kept by a
    # change that replaces it (re-fit, define); None where the lists stayed as they were.
    layout: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class RouterExample(Base):
    """A labelled question: from the admin API or an operator's correction in the query log."""

    __tablename__ = "router_example"
    __table_args__ = never_reused()

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    question: Mapped[str] = mapped_column(Text)
    # None: "none of these / a new topic" (the gate's "none" class)
    expert_id: Mapped[int | None] = mapped_column(
        ForeignKey("expert.id", ondelete="CASCADE"), nullable=True, index=True
    )
    origin: Mapped[str] = mapped_column(String(16), default="api")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class QueryLog(Base):
    __tablename__ = "query_log"
    __table_args__ = never_reused()

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    question: Mapped[str] = mapped_column(Text)
    path: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(32))
    expert_id: Mapped[int | None] = mapped_column(ForeignKey("expert.id", ondelete="SET NULL"), nullable=True)
    confidence: Mapped[float | None] = mapped_column(Float, nullable=True)
    top: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    cited: Mapped[list[int]] = mapped_column(JSON, default=list)
    timings: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)
    vectors_scanned: Mapped[int] = mapped_column(Integer, default=0)
    router_version_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    catalogue_version: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # answered with
    feedback_expert_id: Mapped[int | None] = mapped_column(ForeignKey("expert.id", ondelete="SET NULL"), nullable=True)
    feedback_new_topic: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class ConversationTurn(Base):
    """One question of a conversation (`/ask` or `/v1/chat/completions` with a `conversation_id`):
    as asked, as routed (made standalone, engine.followup), the answer and its route."""

    __tablename__ = "conversation_turn"
    __table_args__ = never_reused()

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    conversation_id: Mapped[str] = mapped_column(String(64), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    question: Mapped[str] = mapped_column(Text)
    standalone: Mapped[str] = mapped_column(Text)
    answer: Mapped[str | None] = mapped_column(Text, nullable=True)
    route: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # path, expert, reason
    cited: Mapped[list[int]] = mapped_column(JSON, default=list)
    query_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # The scoped token that asked it (app.services.tokens); None: an unscoped caller. A scoped
    # token sees and continues only its own conversations.
    owner: Mapped[str | None] = mapped_column(String(200), nullable=True)


class RevokedSession(Base):
    """A console session signed out before it expired (sessions are otherwise stateless)."""

    __tablename__ = "revoked_session"

    signature: Mapped[str] = mapped_column(String(64), primary_key=True)
    expires_at: Mapped[int] = mapped_column(BigInteger, index=True)  # epoch seconds; deleted after


class ApiToken(Base):
    """A named API token (app.services.tokens): only its SHA-256 is stored. `role`: read, write or
    admin; `scope`: the experts, tags and source prefixes it may read ({"experts": [ids], "tags":
    [...], "source_prefixes": [...]}), None for the whole store."""

    __tablename__ = "api_token"
    __table_args__ = never_reused()

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    scope: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class RateBucket(Base):
    """One client's /ask allowance (GCRA): its theoretical arrival time, shared by every worker.

    A row whose `tat` has passed is the same as no row; such rows are deleted from time to time.
    """

    __tablename__ = "rate_bucket"

    client: Mapped[str] = mapped_column(String(64), primary_key=True)  # the client's address
    tat: Mapped[float] = mapped_column(Float)  # epoch seconds


class CatalogueVersion(Base):
    """The catalogue's version (a single row, id 1): bumped by every commit serving processes follow."""

    __tablename__ = "catalogue_version"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    version: Mapped[int] = mapped_column(BigInteger, default=0)
    # Changes (catalogue_change, index_log) up to here were compacted away: a follower or a
    # snapshot older than this cannot replay them and starts from SQL.
    log_horizon: Mapped[int] = mapped_column(BigInteger, default=0)


class CatalogueChange(Base):
    """Which parts one committed version changed (see app.store.catalogue)."""

    __tablename__ = "catalogue_change"

    version: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    parts: Mapped[list[str]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class IndexLog(Base):
    """Append-only: chunks entering (cluster_id) or leaving (None) the index, by catalogue version.

    Written in the writer's transaction with the version it bumped, so a replica that has
    applied the log up to version v holds exactly SQL's chunks as of v.
    """

    __tablename__ = "index_log"

    version: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    chunk_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    cluster_id: Mapped[int | None] = mapped_column(Integer, nullable=True)


def cluster_owners(s: Session) -> dict[int, int | None]:
    """The cluster -> expert mapping as stored, by cluster id (None: no expert owns the list)."""
    return {c: e for c, e in s.execute(select(Cluster.id, Cluster.expert_id).order_by(Cluster.id))}
