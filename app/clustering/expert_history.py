"""Every change to the experts and their mapping is a version that one undo restores
(app.services.expert_undo).

`record` runs inside the transaction of the change, before it writes: it keeps every expert's
row, every list's expert (and keywords and fit floor), the index version and the active router
version; a change that replaces the lists (a re-fit, an expert defined by documents) keeps the
clustering too (centroids and each chunk's list, `layout=True`).
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from app.core.models import Chunk, Cluster, Expert, ExpertsVersion, IndexState, RouterVersion, stack
from app.core.paging import scalar_page

KEPT_VERSIONS = 50  # the newest versions kept; older ones cannot be undone
EXPERT_COLUMNS = (
    "id",
    "name",
    "description",
    "system_prompt",
    "generator",
    "top_k",
    "threshold",
    "documents",
    "owned",
    "slugs",
)


def record(s: Session, action: str, summary: str, *, layout: bool = False) -> ExpertsVersion:
    """Keep the experts and their mapping as they are in `s` now (before `action` changes them)."""
    experts = [{c: getattr(e, c) for c in EXPERT_COLUMNS} for e in s.scalars(select(Expert).order_by(Expert.id))]
    for e in experts:
        e["created_at"] = None
    clusters = [
        {"id": c, "expert_id": e, "keywords": k, "fit_floor": f}
        for c, e, k, f in s.execute(
            select(Cluster.id, Cluster.expert_id, Cluster.keywords, Cluster.fit_floor).order_by(Cluster.id)
        )
    ]
    state = s.get(IndexState, 1)
    router = s.scalar(select(RouterVersion.id).where(RouterVersion.active))
    version = ExpertsVersion(
        action=action,
        summary=summary,
        experts=experts,
        clusters=clusters,
        index_version=state.version if state is not None else "",
        router_version_id=router,
        layout=_layout(s) if layout else None,
    )
    s.add(version)
    s.flush()
    oldest = s.scalar(select(ExpertsVersion.id).order_by(ExpertsVersion.id.desc()).offset(KEPT_VERSIONS).limit(1))
    if oldest is not None:
        s.execute(delete(ExpertsVersion).where(ExpertsVersion.id <= oldest))
    return version


def _layout(s: Session) -> bytes:
    """npz: centroids [C, D] (by list id), chunk ids [N] and their lists [N]."""
    rows = s.execute(select(Cluster.id, Cluster.centroid).order_by(Cluster.id)).all()
    chunks = s.execute(select(Chunk.id, Chunk.cluster_id).order_by(Chunk.id)).all()
    buffer = io.BytesIO()
    dim = len(rows[0][1]) if rows else 0
    np.savez_compressed(
        buffer,
        centroids=stack((r[1] for r in rows), dim) if rows else np.zeros((0, 0), dtype=np.float32),
        ids=np.array([c[0] for c in chunks], dtype=np.int64),
        lists=np.array([-1 if c[1] is None else c[1] for c in chunks], dtype=np.int64),
    )
    return buffer.getvalue()


def history(sessions: sessionmaker[Session], offset: int, limit: int) -> tuple[int, list[dict[str, Any]]]:
    """The versions that can be undone, newest first: id, action, summary, when, experts then."""
    with sessions() as s:
        total, rows = scalar_page(s, select(ExpertsVersion).order_by(ExpertsVersion.id.desc()), offset, limit)
        return total, [
            {
                "id": v.id,
                "action": v.action,
                "summary": v.summary,
                "created_at": v.created_at,
                "experts": [e["name"] for e in v.experts],
                "lists_replaced": v.layout is not None,
            }
            for v in rows
        ]
