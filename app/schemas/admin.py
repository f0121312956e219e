"""The admin API's bodies: experts, clusters, proposals, refits, the router, the question log."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from app.schemas.api import ClusterOut, Experts, Id, Int, Lists, Renamed, Share, TopK, Utc
from engine.generators import GENERATOR_NAME


class ExpertIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    description: str = ""
    system_prompt: str = ""
    generator: str = Field("extractive", pattern=GENERATOR_NAME)
    top_k: TopK = 5
    threshold: Share | None = None


class ExpertPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, min_length=1, max_length=200)
    description: str | None = None
    system_prompt: str | None = None
    generator: str | None = Field(None, pattern=GENERATOR_NAME)
    top_k: TopK | None = None
    threshold: Share | None = None
    owned: bool | None = Field(
        None, description="false releases the expert to automation (a re-fit may regroup it); any other edit owns it"
    )


class ExpertOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    description: str
    system_prompt: str
    generator: str
    top_k: int
    threshold: float | None
    documents: dict[str, Any] | None = Field(None, description="Defined by these documents (null: by its clusters).")
    owned: bool = Field(False, description="The team's: no re-fit, proposal or realign deletes, renames or merges it.")
    slugs: list[str] | None = Field(None, description="Its /v1 model ids' tails (moerag/<slug>), the current first.")
    clusters: list[int] = Field(default_factory=list)


class ExpertDocumentsIn(BaseModel):
    """The documents an expert is defined by: any of ids, a source folder (prefix), a tag."""

    model_config = ConfigDict(extra="forbid")

    ids: list[Id] = Field(default_factory=list, max_length=10_000)
    source_prefix: str | None = Field(None, min_length=1, max_length=1024, description="e.g. docs/k8s/")
    tag: str | None = Field(None, min_length=1, max_length=200, description="metadata.tags holds it")


class ClusterSample(BaseModel):
    chunk_id: int
    document_id: int
    source: str
    text: str


class ClusterDetail(ClusterOut):
    samples: list[ClusterSample]


class ClusterPut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    expert_id: Id | None


class AssignIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cluster_ids: list[Id] = Field(min_length=1)
    expert_id: Id | None


class ProposeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n: Int = Field(6, ge=1, le=500)
    apply: StrictBool = Field(False, description="Create the proposed experts and map their clusters.")
    keep_mapped: StrictBool = Field(
        True,
        description="Clusters an expert already owns stay with it; only unmapped clusters are grouped. "
        "False regroups every cluster (the diff lists what moves and which experts are left empty).",
    )
    names: list[Annotated[str, Field(max_length=200)]] | None = Field(
        None, description="With apply: the experts' names, in the order the proposal listed them (edited names)."
    )
    delete_emptied: StrictBool = Field(
        True, description="With apply and keep_mapped false: delete the experts the regroup leaves empty."
    )


class ReclusterIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    clusters: Lists | None = Field(
        None,
        description="Lists to make; null: MOERAG_CLUSTERS, else the automatic count (sqrt(chunks), "
        "at least 8 chunks a list on average).",
    )


class RefitIn(ReclusterIn):
    experts: Experts | None = Field(None, description="Experts to make; null: as many as today (else 6).")
    apply: StrictBool = Field(
        False, description="False: compute the plan and its diff only (the job's result); true: apply it."
    )
    delete_emptied: StrictBool = Field(True, description="With apply: delete the experts the refit leaves empty.")


class ExampleIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1, max_length=4000)
    expert_id: Id


class TrainIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    activate: StrictBool = Field(
        True, description="Activate the new version unless it is worse than the active one on held-out metrics."
    )
    force: StrictBool = Field(False, description="Activate even when it is worse (the result's held_back says how).")


class RouterVersionOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    active: bool
    created_at: Utc
    temperature: float
    expert_ids: list[int]
    metrics: dict[str, Any]


class QuestionOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    created_at: Utc
    question: str
    path: str
    reason: str
    expert_id: int | None
    confidence: float | None
    top: list[dict[str, Any]]
    timings: dict[str, float]
    feedback_expert_id: int | None
    feedback_new_topic: bool = False  # marked "none of these / a new topic"
    router_version_id: int | None = None
    catalogue_version: int | None = None  # the catalogue version it was answered with


class LabelIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    expert_id: Id | None = Field(description='The right expert; null: "none of these / a new topic".')


class ExampleTry(Renamed):
    RENAMED: ClassVar[dict[str, str]] = {"question": "query"}

    query: str = Field(min_length=1, max_length=2000)


class SyncIn(BaseModel):
    """One source to mirror: a folder on the server, a git repository or a web site."""

    model_config = ConfigDict(extra="forbid")

    folder: str | None = Field(
        None, min_length=1, max_length=4096, description="An absolute folder under MOERAG_SYNC_ROOTS, on the server."
    )
    git: str | None = Field(None, min_length=1, max_length=2048, description="A repository URL under MOERAG_SYNC_URLS.")
    branch: str | None = Field(
        None, min_length=1, max_length=255, pattern=r"^[\w.][\w./-]*$", description="git: the branch"
    )
    site: str | None = Field(None, min_length=1, max_length=2048, description="A start page under MOERAG_SYNC_URLS.")
    max_pages: int = Field(200, ge=1, le=10_000, description="site: pages to crawl at most")
    max_depth: int = Field(5, ge=0, le=100, description="site: links followed from the start page at most")

    @model_validator(mode="after")
    def _one_source(self) -> SyncIn:
        if sum(x is not None for x in (self.folder, self.git, self.site)) != 1:
            raise ValueError("give exactly one of folder, git or site")
        return self


class TokenScopeIn(BaseModel):
    """What a scoped token may read: the union of these experts' lists, documents with any of these
    tags (`metadata.tags`) and documents whose source starts with any of these prefixes."""

    model_config = ConfigDict(extra="forbid")

    experts: list[Id] = Field(default_factory=list, max_length=1000)
    tags: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(default_factory=list, max_length=1000)
    source_prefixes: list[Annotated[str, Field(min_length=1, max_length=1024)]] = Field(
        default_factory=list, max_length=1000
    )


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=200)]
    role: Annotated[
        str,
        Field(
            pattern="^(read|write|admin)$",
            description="read; write (reads, and writes documents within its scope: tags or source "
            "prefixes); admin (everything; no scope)",
        ),
    ] = "read"
    scope: TokenScopeIn | None = Field(None, description="null: the whole store")
    expires_days: Annotated[float, Field(gt=0, le=3650)] | None = None


class TokenOut(BaseModel):
    id: int
    name: str
    role: str
    scope: dict[str, Any] | None
    created_at: str
    expires_at: str | None
    revoked: bool


class TokenCreated(BaseModel):
    token: TokenOut
    secret: str = Field(description="The token itself: shown this once, stored nowhere (only its SHA-256 is)")
