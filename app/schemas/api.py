"""Request and response bodies of the REST API."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Generic, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    model_validator,
)
from pydantic_core.core_schema import ValidatorFunctionWrapHandler

from app.core.limits import SEARCH_K, Passages

INT64_MAX = 2**63 - 1  # the largest id, offset or cluster a request may name (SQL BIGINT, FAISS ids)
PAGE_LIMIT = 500  # the most items one page of any list returns
PAGE_DEFAULT = 50
T = TypeVar("T")


def _number_not_text(value: Any) -> Any:
    """JSON numbers only: "5" and true are refused; for an integer, 5.0 is 5 (as JSON Schema counts it)."""
    if isinstance(value, bool | str | bytes):
        raise ValueError("must be a JSON number")
    return value


# Numbers in request bodies are JSON numbers, never strings or booleans; booleans are StrictBool
# (JSON true/false: a lax bool would take 0, 1 and "yes"). A bounded one names its bounds
# before the validator, in one Annotated: bounds put on an alias of `Int` (or on `Int | None`)
# reach the spec as "ge"/"le", which JSON Schema does not know, so clients and fuzzers ignore them.
Int = Annotated[int, BeforeValidator(_number_not_text)]
Id = Annotated[int, Field(ge=0, le=INT64_MAX), BeforeValidator(_number_not_text)]
Positive = Annotated[int, Field(ge=1), BeforeValidator(_number_not_text)]
TopK = Annotated[int, Field(ge=1, le=50), BeforeValidator(_number_not_text)]  # an expert's passages
Lists = Annotated[int, Field(ge=1, le=65536), BeforeValidator(_number_not_text)]  # IVF lists to make
Experts = Annotated[int, Field(ge=1, le=500), BeforeValidator(_number_not_text)]  # experts to make
# A conversation's id, the client's choice (a UUID, say): letters, digits and `_.:-`.
ConversationId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]
Share = Annotated[float, Field(ge=0, le=1), BeforeValidator(_number_not_text)]  # a threshold: "0.5" is refused
# Stored times are UTC; SQLite returns them without a zone, which a date-time must carry.
Utc = Annotated[datetime, AfterValidator(lambda d: d if d.tzinfo else d.replace(tzinfo=UTC))]


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: list[dict[str, Any]] | None = None
    type: str | None = Field(None, description="OpenAI's error type (the /v1 routes only).")
    param: str | None = Field(None, description="OpenAI's `param` (the /v1 routes only; null).")


class ErrorOut(BaseModel):
    """Every error response: {"error": {"code", "message"[, "details"]}}."""

    error: ErrorDetail


# Documented on every operation: any 4xx or 5xx has the same shape (the codes are in README › API).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": ErrorOut, "description": "The request cannot be served as sent (the code says why)."},
    "5XX": {"model": ErrorOut, "description": "Not ready (503), or an upstream generator failed (502)."},
}


NAME_MAX = 1024  # a document's title or source, in characters (the SQL columns' width)


class UploadFields(BaseModel):
    """The text fields a multipart upload may carry beside its `file`: nothing else."""

    model_config = ConfigDict(extra="forbid")

    title: str | None = Field(None, max_length=NAME_MAX)
    source: str | None = Field(None, max_length=NAME_MAX)


class TagFields(BaseModel):
    """A bulk upload's one field beside its files: `tags`, comma-separated, each file's
    `metadata.tags` (what a write token scoped to tags must name)."""

    model_config = ConfigDict(extra="forbid")

    tags: str | None = Field(None, max_length=NAME_MAX)

    @property
    def tag_list(self) -> list[str]:
        return [t.strip() for t in (self.tags or "").split(",") if t.strip()]

    @property
    def metadata(self) -> dict[str, Any]:
        """The metadata the tags give a document ({} for none)."""
        return {"tags": self.tag_list} if self.tag_list else {}


class FileFields(UploadFields, TagFields):
    """A multipart upload's fields: its title and source, and its tags."""


class TextDocumentIn(UploadFields):
    text: str = Field(min_length=1)
    format: Literal["txt", "md", "html"] = "txt"
    metadata: dict[str, Any] = Field(default_factory=dict)


class IngestOut(BaseModel):
    id: int
    source: str
    chunks: int = Field(description="The document's chunks (for a duplicate: those already stored).")
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
    created_at: Utc
    updated_at: Utc


class ChunkSummary(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    ordinal: int
    heading: str
    token_count: int
    cluster_id: int
    char_start: int
    char_end: int


class DocumentDetail(DocumentOut):
    chunk_list: list[ChunkSummary] = Field(default_factory=list)


class Page(BaseModel, Generic[T]):
    """Every list the API returns: one page of items, how many match in all, and where it starts."""

    items: list[T]
    total: int
    offset: int
    limit: int


DocumentPage = Page[DocumentOut]


class ChunkNeighbour(ChunkSummary):
    text: str


class ChunkOut(ChunkSummary):
    document_id: int
    source: str
    title: str
    text: str
    expert_id: int | None = Field(None, description="The expert its cluster maps to (None: unmapped).")
    previous: ChunkNeighbour | None = Field(None, description="The chunk just before it in its document.")
    next: ChunkNeighbour | None = Field(None, description="The chunk just after it in its document.")


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
    created_at: Utc
    updated_at: Utc


class SearchIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, description="The text to search for (at most MOERAG_MAX_QUESTION_CHARS).")
    k: Positive | None = Passages(f"Chunks to return ({SEARCH_K} by default).")
    clusters: list[Id] | None = Field(None, description="Scan only these clusters; null scans all.")


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
    outside: int = 0  # chunks here whose document belongs mostly to another expert's lists


class ScopeLeakageOut(BaseModel):
    share: float  # of all chunks: outside the expert that holds most of their document
    chunks_outside: int
    per_cluster: dict[int, int]


class ShardVectorsOut(BaseModel):
    shard: str
    vectors: int | None  # None: the shard did not answer in time
    position: int | None  # the catalogue version its replica holds


class StatsOut(BaseModel):
    documents: int
    chunks: int
    clusters: int
    index_vectors: int
    # Over expert shards (MOERAG_SHARD_MAP): each shard's vectors, which sum to `chunks`; else null.
    shards: list[ShardVectorsOut] | None = None


def _document_old_names(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """Each old name as a deprecated property, and the rule: one name per field. A required field
    becomes "exactly one of its two names" (oneOf), an optional one "not both" (not)."""
    props, required = schema.setdefault("properties", {}), schema.get("required", [])
    rules: list[dict[str, Any]] = []
    for old, new in getattr(model, "RENAMED", {}).items():
        props[old] = {
            **props.get(new, {}),
            "deprecated": True,
            "description": f"Deprecated name of {new!r} (accepted for one release).",
        }
        if new in required:
            required.remove(new)
            rules.append({"oneOf": [{"required": [new]}, {"required": [old]}]})
        else:
            rules.append({"not": {"required": [new, old]}})
    if not required:
        schema.pop("required", None)
    if rules:
        schema["allOf"] = rules


class Renamed(BaseModel):
    """A request body whose fields had other names before: the old names are still accepted, for one
    release, as deprecated aliases (documented as such; `deprecated_names` says which were sent).
    Sending a field under both names is a 422."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_document_old_names)
    RENAMED: ClassVar[dict[str, str]] = {}  # old name -> new name
    _deprecated: list[str] = PrivateAttr(default_factory=list)

    @model_validator(mode="wrap")
    @classmethod
    def _old_names(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        used = [old for old in cls.RENAMED if isinstance(data, dict) and old in data]
        if used:
            clash = [old for old in used if cls.RENAMED[old] in data]
            if clash:
                raise ValueError(f"send {cls.RENAMED[clash[0]]!r} only: {clash[0]!r} is its deprecated name")
            data = {cls.RENAMED.get(k, k): v for k, v in data.items()}
        model = handler(data)
        model._deprecated = used
        return model

    @property
    def deprecated_names(self) -> list[str]:
        return list(self._deprecated)


class AskIn(Renamed):
    RENAMED: ClassVar[dict[str, str]] = {"question": "query", "top_k": "k"}

    query: str = Field(min_length=1, description="The question (at most MOERAG_MAX_QUESTION_CHARS).")
    k: Positive | None = Passages("Passages to cite (default: the expert's top-k, or 5).")
    mode: Literal["auto", "expert", "fallback"] = "auto"
    expert: Id | None = Field(None, description="Expert id for mode=expert (default: the router's top expert).")
    generate: StrictBool = True
    stream: StrictBool = False
    conversation_id: ConversationId | None = Field(
        None, description="A turn of this conversation (a new id starts one): a follow-up is made standalone first."
    )


class CitationOut(BaseModel):
    n: int
    document_id: int
    source: str
    title: str
    chunk_id: int
    heading: str
    score: float = Field(
        description="Rank score on one scale for both paths. MOERAG_FUSION=convex (the default): the chunk's "
        "cosine similarity plus MOERAG_LEXICAL_WEIGHT x its BM25 score over the best BM25 score in the searched "
        "scope, so at most 1 + that weight; rrf: sum of w / (60 + rank) over the dense and BM25 ranks (dense "
        "w = 1, BM25 w = MOERAG_LEXICAL_WEIGHT), at most ~0.018. Plain cosine similarities are what /search returns."
    )
    text: str
    used: bool = Field(False, description="The answer cites this passage ([n] appears in it).")


class AskOut(BaseModel):
    answer: str | None
    citations: list[CitationOut]
    route: dict[str, Any]
    timings_ms: dict[str, float]
    query_id: int | None = Field(
        description="The question's row in the query log (feedback names it); null if it could not be "
        "written (a full disk: the answer is still given)."
    )
    conversation_id: str | None = None
    standalone_question: str | None = Field(
        None, description="With a conversation_id: the question as it was routed (a follow-up made standalone)."
    )
    standalone_by: Literal["llm", "rule"] | None = Field(
        None, description="What rewrote the question (the configured model or the rule); null: routed as asked."
    )


class TurnOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    created_at: Utc
    question: str = Field(description="As asked.")
    standalone: str = Field(description="As routed: a follow-up made standalone from the turn before.")
    answer: str | None
    route: dict[str, Any] = Field(description="path, expert, reason")
    cited: list[int] = Field(description="The chunk ids cited, in order.")
    query_id: int | None


class ConversationOut(BaseModel):
    id: str
    turns: list[TurnOut]


class ConversationSummary(BaseModel):
    id: str
    turns: int
    last_at: Utc
