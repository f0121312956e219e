"""Admin JSON API (admin token on every route)."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import func, select

from app.deps import AdminDep, RuntimeDep
from app.models import Chunk, Cluster
from app.schemas import ClusterOut, JobOut

router = APIRouter(prefix="/admin/api", tags=["admin"], dependencies=[AdminDep])


@router.post("/recluster", response_model=JobOut, status_code=202)
def recluster(rt: RuntimeDep) -> JobOut:
    """k-means over the stored embeddings (a job); experts carry over by majority vote."""
    return JobOut.model_validate(rt.jobs.submit("recluster", {}, total=4))


@router.get("/clusters", response_model=list[ClusterOut])
def clusters(rt: RuntimeDep) -> list[ClusterOut]:
    with rt.sessions() as s:
        counts = s.execute(select(Chunk.cluster_id, func.count(Chunk.id)).group_by(Chunk.cluster_id))
        sizes = {cluster: n for cluster, n in counts}
        return [
            ClusterOut(id=c.id, size=sizes.get(c.id, 0), keywords=c.keywords or [], expert_id=c.expert_id)
            for c in s.scalars(select(Cluster).order_by(Cluster.id))
        ]
