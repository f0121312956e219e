"""Admin JSON API (admin token on every route): clusters, experts, router, questions."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response
from sqlalchemy import func, select
from starlette.concurrency import run_in_threadpool

from app.deps import AdminDep, IdPath, Offset, RuntimeDep
from app.errors import ApiError
from app.models import Chunk, Cluster, Document, Expert, QueryLog, RouterExample, RouterVersion, stack
from app.schemas import (
    AssignIn,
    ClusterDetail,
    ClusterOut,
    ClusterPut,
    ClusterSample,
    ExampleIn,
    ExampleTry,
    ExpertIn,
    ExpertOut,
    ExpertPatch,
    JobOut,
    LabelIn,
    ProposeIn,
    QuestionOut,
    RouterVersionOut,
    ScopeLeakageOut,
    TrainIn,
)
from app.services import experts as expert_service
from app.services.documents import NotFound

router = APIRouter(prefix="/admin/api", tags=["admin"], dependencies=[AdminDep])


# ---- clusters -----------------------------------------------------------------------------------------


@router.post("/recluster", response_model=JobOut, status_code=202)
def recluster(rt: RuntimeDep) -> JobOut:
    """k-means over the stored embeddings (a job); experts carry over by majority vote."""
    return JobOut.model_validate(rt.jobs.submit("recluster", {}, total=4))


def _sizes(rt: RuntimeDep) -> dict[int, int]:
    with rt.sessions() as s:
        counts = s.execute(select(Chunk.cluster_id, func.count(Chunk.id)).group_by(Chunk.cluster_id))
        return {cluster: n for cluster, n in counts}


@router.get("/clusters", response_model=list[ClusterOut])
def clusters(rt: RuntimeDep) -> list[ClusterOut]:
    sizes = _sizes(rt)
    outside = rt.indexes.scope_leakage()["per_cluster"]
    with rt.sessions() as s:
        return [
            ClusterOut(
                id=c.id,
                size=sizes.get(c.id, 0),
                keywords=c.keywords or [],
                expert_id=c.expert_id,
                outside=outside.get(c.id, 0),
            )
            for c in s.scalars(select(Cluster).order_by(Cluster.id))
        ]


@router.get("/scope-leakage", response_model=ScopeLeakageOut)
def scope_leakage(rt: RuntimeDep) -> ScopeLeakageOut:
    """Chunks an expert path cannot reach: outside the expert holding most of their document."""
    return ScopeLeakageOut(**rt.indexes.scope_leakage())


@router.get("/clusters/{cluster_id}", response_model=ClusterDetail)
def cluster_detail(
    cluster_id: IdPath, rt: RuntimeDep, samples: Annotated[int, Query(ge=0, le=50)] = 5
) -> ClusterDetail:
    with rt.sessions() as s:
        c = s.get(Cluster, cluster_id)
        if c is None:
            raise NotFound(f"cluster {cluster_id} not found")
        size = s.scalar(select(func.count(Chunk.id)).where(Chunk.cluster_id == cluster_id)) or 0
        rows = s.execute(
            select(Chunk.id, Chunk.document_id, Document.source, Chunk.text)
            .join(Document, Document.id == Chunk.document_id)
            .where(Chunk.cluster_id == cluster_id)
            .order_by(Chunk.id)
            .limit(samples)
        ).all()
        return ClusterDetail(
            id=c.id,
            size=size,
            keywords=c.keywords or [],
            expert_id=c.expert_id,
            samples=[ClusterSample(chunk_id=r[0], document_id=r[1], source=r[2], text=r[3]) for r in rows],
        )


@router.put("/clusters/{cluster_id}", response_model=ClusterOut)
def put_cluster(cluster_id: IdPath, body: ClusterPut, rt: RuntimeDep) -> ClusterOut:
    with rt.sessions.begin() as s:
        expert_service.assign_clusters(s, [cluster_id], body.expert_id)
    rt.mapping_changed()
    return next(c for c in clusters(rt) if c.id == cluster_id)


@router.post("/clusters/assign")
def assign(body: AssignIn, rt: RuntimeDep) -> dict[str, int]:
    with rt.sessions.begin() as s:
        n = expert_service.assign_clusters(s, body.cluster_ids, body.expert_id)
    return {"assigned": n, "realign_job": rt.mapping_changed()}


# ---- experts ------------------------------------------------------------------------------------------


def _expert_out(e: Expert, owned: dict[int, list[int]]) -> ExpertOut:
    out = ExpertOut.model_validate(e)
    out.clusters = sorted(owned.get(e.id, []))
    return out


def _owned(rt: RuntimeDep) -> dict[int, list[int]]:
    return {e: list(p.clusters) for e, p in rt.experts.profiles().items()}


@router.get("/experts", response_model=list[ExpertOut])
def list_experts(rt: RuntimeDep) -> list[ExpertOut]:
    owned = _owned(rt)
    with rt.sessions() as s:
        return [_expert_out(e, owned) for e in s.scalars(select(Expert).order_by(Expert.id))]


@router.post("/experts", response_model=ExpertOut, status_code=201)
def create_expert(body: ExpertIn, rt: RuntimeDep) -> ExpertOut:
    rt.check_generator(body.generator)
    with rt.sessions.begin() as s:
        e = expert_service.create_expert(s, body.model_dump())
        out = _expert_out(e, {})
    return out


@router.patch("/experts/{expert_id}", response_model=ExpertOut)
def patch_expert(expert_id: IdPath, body: ExpertPatch, rt: RuntimeDep) -> ExpertOut:
    if body.generator is not None:
        rt.check_generator(body.generator)
    with rt.sessions.begin() as s:
        expert_service.update_expert(s, expert_id, body.model_dump(exclude_unset=True))
    return next(e for e in list_experts(rt) if e.id == expert_id)


@router.delete("/experts/{expert_id}", status_code=204)
def delete_expert(expert_id: IdPath, rt: RuntimeDep) -> Response:
    with rt.sessions.begin() as s:
        expert_service.delete_expert(s, expert_id)
    rt.mapping_changed()
    return Response(status_code=204)


@router.post("/experts/propose")
def propose(body: ProposeIn, rt: RuntimeDep) -> dict[str, object]:
    """Group clusters into N experts by centroid; `apply` creates them and maps their clusters."""
    with rt.sessions.begin() as s:
        proposals = expert_service.propose(s, body.n, rt.embedder.dim)
        if body.apply:
            taken = set(s.scalars(select(Expert.name)))
            for p in proposals:
                name, i = p["name"], 2
                while name in taken:
                    name, i = f"{p['name']} ({i})", i + 1
                taken.add(name)
                e = expert_service.create_expert(s, {"name": name, "description": ", ".join(p["keywords"])})
                expert_service.assign_clusters(s, p["cluster_ids"], e.id)
                p["expert_id"] = e.id
    if body.apply:
        rt.mapping_changed()
    return {"proposals": proposals, "applied": body.apply}


# ---- router -------------------------------------------------------------------------------------------


@router.post("/router/train", response_model=JobOut, status_code=202)
def train_router(rt: RuntimeDep, body: TrainIn | None = None) -> JobOut:
    params = {"activate": body.activate, "force": body.force} if body else {"activate": True, "force": False}
    return JobOut.model_validate(rt.jobs.submit("train", params, total=100))


@router.get("/router/versions", response_model=list[RouterVersionOut])
def router_versions(rt: RuntimeDep) -> list[RouterVersionOut]:
    with rt.sessions() as s:
        versions = s.scalars(select(RouterVersion).order_by(RouterVersion.id.desc()))
        return [RouterVersionOut.model_validate(v) for v in versions]


@router.get("/router/staleness")
def router_staleness(rt: RuntimeDep) -> dict[str, object]:
    """Whether the active router was trained on today's cluster -> expert mapping (and what changed)."""
    return rt.routers.staleness()


@router.post("/router/versions/{version_id}/activate")
async def activate(version_id: IdPath, rt: RuntimeDep) -> dict[str, int]:
    try:
        await run_in_threadpool(rt.routers.activate, version_id)
    except LookupError as exc:
        raise NotFound(str(exc)) from None
    return {"active": version_id}


@router.post("/router/examples", status_code=201)
def add_examples(body: list[ExampleIn], rt: RuntimeDep) -> dict[str, int]:
    """Labelled questions: training data for the next router version."""
    with rt.sessions.begin() as s:
        known = set(s.scalars(select(Expert.id)))
        unknown = sorted({e.expert_id for e in body} - known)
        if unknown:
            raise ApiError(422, "unknown_expert", f"experts not found: {unknown}")
        s.add_all(RouterExample(question=e.question, expert_id=e.expert_id, origin="api") for e in body)
    return {"added": len(body)}


# ---- questions ----------------------------------------------------------------------------------------


@router.get("/questions", response_model=list[QuestionOut])
def questions(
    rt: RuntimeDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Offset = 0,
) -> list[QuestionOut]:
    with rt.sessions() as s:
        rows = s.scalars(select(QueryLog).order_by(QueryLog.id.desc()).offset(offset).limit(limit))
        return [QuestionOut.model_validate(q) for q in rows]


@router.post("/questions/{query_id}/label")
def label_question(query_id: IdPath, body: LabelIn, rt: RuntimeDep) -> dict[str, int]:
    """An operator marks the right expert: the question becomes router training data."""
    with rt.sessions.begin() as s:
        q = s.get(QueryLog, query_id)
        if q is None:
            raise NotFound(f"question {query_id} not found")
        if s.get(Expert, body.expert_id) is None:
            raise NotFound(f"expert {body.expert_id} not found")
        q.feedback_expert_id = body.expert_id
        s.add(RouterExample(question=q.question, expert_id=body.expert_id, origin="feedback"))
    return {"labelled": query_id}


# ---- console views ------------------------------------------------------------------------------------


@router.get("/overview")
def overview(rt: RuntimeDep, buckets: Annotated[int, Query(ge=1, le=200)] = 24) -> dict[str, object]:
    """Counts, the active router, routing share over time and load per expert, for the console."""
    with rt.sessions() as s:
        recent = s.execute(
            select(QueryLog.created_at, QueryLog.path, QueryLog.expert_id).order_by(QueryLog.id.desc()).limit(5000)
        ).all()
        active = s.scalars(select(RouterVersion).where(RouterVersion.active)).first()
        names = {e.id: e.name for e in s.scalars(select(Expert))}
    share: list[dict[str, object]] = []
    if recent:
        times = [r[0].timestamp() for r in recent]
        lo, hi = min(times), max(times) + 1e-6
        width = (hi - lo) / buckets
        counts = [[0, 0] for _ in range(buckets)]
        for t, (_, path, _) in zip(times, recent, strict=True):
            counts[min(int((t - lo) / width), buckets - 1)][0 if path == "expert" else 1] += 1
        share = [{"start": lo + i * width, "expert": c[0], "fallback": c[1]} for i, c in enumerate(counts)]
    load: dict[str, int] = {}
    for _, path, eid in recent:
        if path == "expert" and eid is not None:
            load[names.get(eid, str(eid))] = load.get(names.get(eid, str(eid)), 0) + 1
    scalar = {k: v for k, v in (active.metrics if active else {}).items() if isinstance(v, int | float)}
    return {
        "stats": rt.stats(),
        "router": {"id": active.id, "created_at": active.created_at.isoformat(), "metrics": scalar} if active else None,
        "questions": len(recent),
        "share": share,
        "load": [{"expert": k, "hits": v} for k, v in sorted(load.items(), key=lambda kv: -kv[1])],
        "kernels": rt.kernel_backend,
    }


@router.get("/clusters-map")
def clusters_map(rt: RuntimeDep) -> list[dict[str, object]]:
    """A 2-D projection (PCA) of the cluster centroids, for the map."""
    import numpy as np

    sizes = _sizes(rt)
    with rt.sessions() as s:
        rows = s.scalars(select(Cluster).order_by(Cluster.id)).all()
        if not rows:
            return []
        c = stack((r.centroid for r in rows), len(rows[0].centroid))
        centred = c - c.mean(axis=0)  # [C, D]
        if len(rows) > 1:
            _, _, vt = np.linalg.svd(centred, full_matrices=False)
            xy = centred @ vt[:2].T  # [C, 2]
        else:
            xy = np.zeros((1, 2))
        if xy.shape[1] < 2:
            xy = np.pad(xy, ((0, 0), (0, 2 - xy.shape[1])))
        return [
            {"id": r.id, "x": float(p[0]), "y": float(p[1]), "size": sizes.get(r.id, 0), "expert_id": r.expert_id}
            for r, p in zip(rows, xy, strict=True)
        ]


@router.post("/router/try")
async def try_question(body: ExampleTry, rt: RuntimeDep) -> dict[str, object]:
    """What the router would do with a question: probabilities and path (not logged, no answer)."""
    from app.services.ask import route_json
    from engine.pipeline import AskRequest

    prepared = await run_in_threadpool(rt.pipeline.prepare, AskRequest(body.question))
    return {"route": route_json(prepared.route), "citations": len(prepared.citations)}
