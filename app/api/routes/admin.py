"""Admin JSON API (admin token on every route): clusters, experts, router, questions."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from starlette.concurrency import run_in_threadpool

from app.api.deps import AdminDep, IdPath, Limit, Offset, RuntimeDep
from app.clustering import expert_documents, expert_history
from app.core.models import Expert
from app.schemas.admin import (
    AssignIn,
    ClusterDetail,
    ClusterPut,
    ClusterSample,
    ExampleIn,
    ExampleTry,
    ExpertDocumentsIn,
    ExpertIn,
    ExpertOut,
    ExpertPatch,
    LabelIn,
    ProposeIn,
    QuestionOut,
    ReclusterIn,
    RefitIn,
    RouterVersionOut,
    SyncIn,
    TokenCreated,
    TokenIn,
    TokenOut,
    TrainIn,
)
from app.schemas.api import PAGE_DEFAULT, PAGE_LIMIT, ClusterOut, JobOut, Page, ScopeLeakageOut
from app.services import clusters as cluster_service
from app.services import experts as expert_service
from app.services import questions as question_service
from app.services import sync as sync_service
from app.services.sync_bounds import allowed_url
from engine.errors import InputError, NotFound

router = APIRouter(prefix="/admin/api", tags=["admin"], dependencies=[AdminDep])


# ---- clusters -----------------------------------------------------------------------------------------


@router.post("/sync", response_model=JobOut, status_code=202)
def sync(body: SyncIn, rt: RuntimeDep) -> JobOut:
    """Mirror a folder, a git repository or a web site into the store (a job): new files in,
    changed ones updated, files gone from the folder or the commit deleted, pages only when they
    answer 404 or 410. Symbolic links are skipped and reported; every URL, redirects included,
    must lie under MOERAG_SYNC_URLS."""
    if body.folder is not None:
        params: dict[str, object] = {"folder": sync_service.allowed_folder(body.folder, rt.settings.sync_roots)}
    elif body.git is not None:
        params = {"git": allowed_url(body.git, rt.settings.sync_urls), "branch": body.branch}
    else:
        site = allowed_url(body.site or "", rt.settings.sync_urls)
        params = {"site": site, "max_pages": body.max_pages, "max_depth": body.max_depth}
    return JobOut.model_validate(rt.jobs.submit("sync", params, coalesce=True))


@router.post("/recluster", response_model=JobOut, status_code=202)
def recluster(rt: RuntimeDep, body: ReclusterIn | None = None) -> JobOut:
    """k-means over the stored embeddings (a job); experts carry over by majority vote."""
    params = {"clusters": body.clusters} if body is not None and body.clusters else {}
    return JobOut.model_validate(rt.jobs.submit("recluster", params, total=4, coalesce=True))


@router.get("/clusters", response_model=Page[ClusterOut])
def clusters(rt: RuntimeDep, offset: Offset = 0, limit: Limit = PAGE_LIMIT) -> Page[ClusterOut]:
    total, rows = cluster_service.list_clusters(rt.sessions, offset, limit)
    return Page(items=_clusters_out(rt, rows), total=total, offset=offset, limit=limit)


def _clusters_out(rt: RuntimeDep, rows: list[cluster_service.ClusterRow]) -> list[ClusterOut]:
    outside = rt.indexes.scope_leakage()["per_cluster"]
    return [
        ClusterOut(id=c.id, size=c.size, keywords=c.keywords, expert_id=c.expert_id, outside=outside.get(c.id, 0))
        for c in rows
    ]


@router.get("/scope-leakage", response_model=ScopeLeakageOut)
def scope_leakage(rt: RuntimeDep) -> ScopeLeakageOut:
    """Chunks an expert path cannot reach: outside the expert holding most of their document."""
    return ScopeLeakageOut(**rt.indexes.scope_leakage())


@router.get("/clusters/{cluster_id:int}", response_model=ClusterDetail)
def cluster_detail(
    cluster_id: IdPath, rt: RuntimeDep, samples: Annotated[int, Query(ge=0, le=50)] = 5
) -> ClusterDetail:
    c, rows = cluster_service.cluster_detail(rt.sessions, cluster_id, samples)
    return ClusterDetail(
        id=c.id,
        size=c.size,
        keywords=c.keywords,
        expert_id=c.expert_id,
        samples=[
            ClusterSample(chunk_id=r.chunk_id, document_id=r.document_id, source=r.source, text=r.text) for r in rows
        ],
    )


@router.put("/clusters/{cluster_id:int}", response_model=ClusterOut)
def put_cluster(cluster_id: IdPath, body: ClusterPut, rt: RuntimeDep) -> ClusterOut:
    row = cluster_service.assign(rt.sessions, cluster_id, body.expert_id)
    rt.mapping_changed()
    return _clusters_out(rt, [row])[0]


@router.post("/clusters/assign")
def assign(body: AssignIn, rt: RuntimeDep) -> dict[str, int]:
    n = expert_service.assign(rt.sessions, body.cluster_ids, body.expert_id)
    return {"assigned": n, "realign_job": rt.mapping_changed()}


# ---- experts ------------------------------------------------------------------------------------------


def _expert_out(e: Expert, owned: dict[int, list[int]]) -> ExpertOut:
    out = ExpertOut.model_validate(e)
    out.clusters = sorted(owned.get(e.id, []))
    return out


def _owned(rt: RuntimeDep) -> dict[int, list[int]]:
    return {e: list(p.clusters) for e, p in rt.state().experts.items()}


@router.get("/experts", response_model=Page[ExpertOut])
def list_experts(rt: RuntimeDep, offset: Offset = 0, limit: Limit = PAGE_LIMIT) -> Page[ExpertOut]:
    owned = _owned(rt)
    total, rows = expert_service.list_page(rt.sessions, offset, limit)
    return Page(items=[_expert_out(e, owned) for e in rows], total=total, offset=offset, limit=limit)


@router.post("/experts", response_model=ExpertOut, status_code=201)
def create_expert(body: ExpertIn, rt: RuntimeDep) -> ExpertOut:
    rt.generators.check(body.generator)
    return _expert_out(expert_service.create(rt.sessions, body.model_dump()), {})


@router.patch("/experts/{expert_id:int}", response_model=ExpertOut)
def patch_expert(expert_id: IdPath, body: ExpertPatch, rt: RuntimeDep) -> ExpertOut:
    if body.generator is not None:
        rt.generators.check(body.generator)
    expert = expert_service.edit(rt.sessions, expert_id, body.model_dump(exclude_unset=True))
    return _expert_out(expert, _owned(rt))


@router.delete("/experts/{expert_id:int}")
def delete_expert(expert_id: IdPath, rt: RuntimeDep) -> dict[str, Any]:
    """Delete an expert: -> what was deleted, its documents and where they go (the fallback, until
    their lists are mapped or a re-fit places them); `POST /experts/undo` brings it back."""
    result = expert_service.delete(rt.sessions, expert_id)
    rt.mapping_changed()
    return result


@router.get("/experts/history", response_model=Page[dict[str, Any]])
def experts_history(rt: RuntimeDep, offset: Offset = 0, limit: Limit = PAGE_DEFAULT) -> Page[dict[str, Any]]:
    """The changes to the experts and their mapping that can be undone, newest first."""
    total, rows = expert_history.history(rt.sessions, offset, limit)
    return Page(items=rows, total=total, offset=offset, limit=limit)


@router.post("/experts/undo", response_model=JobOut, status_code=202)
def undo_experts(rt: RuntimeDep) -> JobOut:
    """Undo the last change to the experts (re-fit, proposal, map, define, delete, edit): a job
    restores the experts, their mapping, the lists when the change replaced them, and the router."""
    return JobOut.model_validate(rt.jobs.submit("undo", {}, total=1, coalesce=True))


@router.put("/experts/{expert_id:int}/documents", response_model=JobOut, status_code=202)
def define_by_documents(expert_id: IdPath, body: ExpertDocumentsIn, rt: RuntimeDep) -> JobOut:
    """Define an expert by documents (ids, a source folder, a tag): a job gives it lists fitted on
    exactly their chunks (matching documents stored later go there too) and trains a router."""
    selector = body.model_dump(exclude_defaults=True)
    if not selector:
        raise InputError("give ids, source_prefix or tag: the documents that define the expert")
    held = expert_documents.define(rt.sessions, expert_id, selector)
    job = rt.jobs.submit("scope", {"expert_id": expert_id, "documents": held}, total=100)
    return JobOut.model_validate(job)


@router.delete("/experts/{expert_id:int}/documents", status_code=204)
def undefine_by_documents(expert_id: IdPath, rt: RuntimeDep) -> Response:
    """The expert is defined by its clusters again (it keeps them); later documents are placed by vote."""
    expert_documents.define(rt.sessions, expert_id, None)
    return Response(status_code=204)


@router.post("/experts/propose")
def propose(body: ProposeIn, rt: RuntimeDep) -> dict[str, object]:
    """Group clusters into N experts by centroid, named from their documents' titles and headings,
    with the diff against today's mapping; `apply` creates them and maps their clusters."""
    result = expert_service.propose_and_apply(
        rt.sessions,
        body.n,
        rt.embedder.dim,
        apply=body.apply,
        keep_mapped=body.keep_mapped,
        names=body.names,
        delete_emptied=body.delete_emptied,
    )
    if body.apply:
        rt.mapping_changed()
    return {**result, "applied": body.apply}


@router.post("/experts/refit", response_model=JobOut, status_code=202)
def refit(body: RefitIn, rt: RuntimeDep) -> JobOut:
    """Re-fit the experts to the content as one job: recluster -> proposal -> diff -> accept ->
    retrain. Without `apply` the job only computes the plan (its result: the lists, the experts
    kept, created and emptied); with it, the plan is computed again on the store as it is and
    applied, the emptied experts deleted (unless `delete_emptied` is false), a router trained."""
    params = body.model_dump()
    return JobOut.model_validate(rt.jobs.submit("refit", params, total=100 if body.apply else 4, coalesce=True))


# ---- router -------------------------------------------------------------------------------------------


@router.post("/router/train", response_model=JobOut, status_code=202)
def train_router(rt: RuntimeDep, body: TrainIn | None = None) -> JobOut:
    params = {"activate": body.activate, "force": body.force} if body else {"activate": True, "force": False}
    return JobOut.model_validate(rt.jobs.submit("train", params, total=100, coalesce=True))


@router.get("/router/versions", response_model=Page[RouterVersionOut])
def router_versions(rt: RuntimeDep, offset: Offset = 0, limit: Limit = PAGE_DEFAULT) -> Page[RouterVersionOut]:
    """Stored versions, newest first."""
    total, rows = rt.routers.versions(offset, limit)
    return Page(items=[RouterVersionOut.model_validate(v) for v in rows], total=total, offset=offset, limit=limit)


@router.get("/router/staleness")
def router_staleness(rt: RuntimeDep) -> dict[str, object]:
    """Whether the active router was trained on today's cluster -> expert mapping (and what changed)."""
    return rt.routers.staleness()


@router.post("/router/versions/{version_id:int}/activate")
async def activate(version_id: IdPath, rt: RuntimeDep) -> dict[str, int]:
    try:
        await run_in_threadpool(rt.routers.activate, version_id)
    except LookupError as exc:
        raise NotFound(str(exc)) from None
    return {"active": version_id}


@router.post("/router/examples", status_code=201)
def add_examples(body: list[ExampleIn], rt: RuntimeDep) -> dict[str, int]:
    """Labelled questions: training data for the next router version."""
    return {"added": question_service.add_examples(rt.sessions, [(e.question, e.expert_id) for e in body])}


# ---- questions ----------------------------------------------------------------------------------------


@router.get("/questions", response_model=Page[QuestionOut])
def questions(rt: RuntimeDep, offset: Offset = 0, limit: Limit = PAGE_DEFAULT) -> Page[QuestionOut]:
    """Questions asked, newest first."""
    total, rows = question_service.recent(rt.sessions, offset, limit)
    return Page(items=[QuestionOut.model_validate(q) for q in rows], total=total, offset=offset, limit=limit)


@router.post("/questions/{query_id:int}/label")
def label_question(query_id: IdPath, body: LabelIn, rt: RuntimeDep) -> dict[str, int]:
    """An operator marks the right expert: the question becomes router training data."""
    question_service.label(rt.sessions, query_id, body.expert_id)
    return {"labelled": query_id}


# ---- console views ------------------------------------------------------------------------------------


@router.get("/overview")
def overview(rt: RuntimeDep, buckets: Annotated[int, Query(ge=1, le=200)] = 24) -> dict[str, object]:
    """Counts, the active router, routing share over time and load per expert, for the console."""
    return {"stats": rt.stats(), **question_service.overview(rt.sessions, buckets), "kernels": rt.kernel_backend}


@router.get("/clusters-map")
def clusters_map(rt: RuntimeDep) -> list[dict[str, object]]:
    """A 2-D projection (PCA) of the cluster centroids, for the map."""
    return cluster_service.cluster_map(rt.sessions)


@router.post("/router/try")
async def try_question(body: ExampleTry, rt: RuntimeDep) -> dict[str, object]:
    """What the router would do with a question: probabilities and path (not logged, no answer)."""
    from app.services.ask import route_json
    from engine.pipeline import AskRequest

    prepared = await run_in_threadpool(rt.pipeline.prepare, AskRequest(body.query))
    return {"route": route_json(prepared.route), "citations": len(prepared.citations)}


@router.get("/shards")
async def shards(rt: RuntimeDep) -> dict[str, object]:
    """The expert shards this server searches (MOERAG_SHARD_MAP): each shard's experts, replicas,
    lists, vectors, index position and searches sent. `shard_map` is null and `shards` empty when
    the server searches its own full replica (the default)."""
    tier = rt.services.states.shards
    if tier is None:
        return {"shard_map": None, "shards": []}
    return {"shard_map": rt.state().shard_map, "shards": await run_in_threadpool(tier.overview)}


@router.post("/tokens", response_model=TokenCreated, status_code=201)
def create_token(body: TokenIn, rt: RuntimeDep) -> TokenCreated:
    """A named token with a role and a scope (null: the whole store); the secret is in this answer only.
    A first scoped token closes anonymous reads: every read then needs a token."""
    scope = body.scope.model_dump() if body.scope is not None else None
    row, secret = rt.tokens.create(body.name, body.role, scope, body.expires_days)
    return TokenCreated(token=TokenOut(**row), secret=secret)


@router.get("/tokens", response_model=list[TokenOut])
def list_tokens(rt: RuntimeDep) -> list[TokenOut]:
    """Every token, revoked ones included (never a secret)."""
    return [TokenOut(**row) for row in rt.tokens.list()]


@router.delete("/tokens/{token_id:int}", response_model=TokenOut)
def revoke_token(token_id: IdPath, rt: RuntimeDep) -> TokenOut:
    """Revoke a token: refused from its next request on."""
    return TokenOut(**rt.tokens.revoke(token_id))
