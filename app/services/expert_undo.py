"""Undo: the newest version of the experts (app.clustering.expert_history) restored, then removed.

What comes back: the experts (re-created under their ids when the change deleted them, removed
when it created them, their fields as they were), the mapping, the lists when the change
replaced them (chunks stored since are placed into the restored lists), and the router version
active then (trained again when it is gone).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from app.clustering import reclustering
from app.core.models import Chunk, Cluster, Expert, ExpertsVersion, IndexState, RouterVersion, stack
from engine.errors import Conflict
from index.fit import fits, floors

log = logging.getLogger(__name__)


def _restore_experts(s: Session, version: ExpertsVersion) -> dict[str, list[str]]:
    """The experts' rows as `version` kept them: -> {restored, removed, reverted} names."""
    then = {e["id"]: e for e in version.experts}
    now = {e.id: e for e in s.scalars(select(Expert))}
    removed = [now[i].name for i in sorted(now.keys() - then.keys())]
    s.execute(update(Cluster).where(Cluster.expert_id.in_(now.keys() - then.keys())).values(expert_id=None))
    s.execute(delete(Expert).where(Expert.id.in_(now.keys() - then.keys())))
    s.flush()
    # Names swap places in a rename chain: clear them first so the unique index holds at each step.
    for i in sorted(then.keys() & now.keys()):
        now[i].name = f"~restoring {i}~"
    s.flush()
    restored, reverted = [], []
    for i, fields in sorted(then.items()):
        values = {k: v for k, v in fields.items() if k != "created_at"}
        if i in now:
            changed = any(getattr(now[i], k) != v for k, v in values.items() if k != "name")
            for k, v in values.items():
                setattr(now[i], k, v)
            if changed:
                reverted.append(values["name"])
        else:
            s.add(Expert(**values))
            restored.append(values["name"])
    s.flush()
    return {"restored": restored, "removed": removed, "reverted": reverted}


def undo(
    indexes: reclustering.IndexManager, activate: Callable[[int], None], retrain: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """Restore the newest version (see the module doc) and remove it. -> what came back.

    activate(router version id) makes the router active then active again; `retrain()` trains
    one when that version is gone. Conflict when there is nothing to undo, or when the lists were
    replaced since by a change that kept no version (a recluster) and the mapping cannot apply."""
    with indexes.write_lock:
        with indexes.sessions() as s:
            version = s.scalars(select(ExpertsVersion).order_by(ExpertsVersion.id.desc()).limit(1)).first()
            if version is None:
                raise Conflict("nothing to undo: no change to the experts is recorded")
            live = s.scalar(select(IndexState.version).where(IndexState.id == 1)) or ""
            s.expunge(version)
        if version.layout is None and version.index_version != live:
            raise Conflict(
                f"cannot undo {version.action!r}: the lists were replaced since (index {version.index_version} is "
                f"now {live}), so its mapping no longer applies; re-fit or map the clusters instead"
            )
        changes: dict[str, list[str]] = {}
        if version.layout is not None:
            clustering = _clustering(indexes, version)
            kept = {c["id"]: c["expert_id"] for c in version.clusters}

            def owners(s: Session) -> list[int | None]:
                changes.update(_restore_experts(s, version))
                return [kept.get(c) for c in range(clustering.k)]

            reclustering.commit(indexes, clustering, owners)
        with indexes.sessions.begin() as s:
            if version.layout is None:
                indexes.lock_clustering(s)
                changes.update(_restore_experts(s, version))
                for c in version.clusters:
                    s.execute(update(Cluster).where(Cluster.id == c["id"]).values(expert_id=c["expert_id"]))
            s.execute(delete(ExpertsVersion).where(ExpertsVersion.id == version.id))
            router_kept = version.router_version_id is not None and (
                s.get(RouterVersion, version.router_version_id) is not None
            )
    result: dict[str, Any] = {"undone": version.id, "action": version.action, "summary": version.summary, **changes}
    if router_kept and version.router_version_id is not None:
        activate(version.router_version_id)
        result["router_version"] = version.router_version_id
    elif version.router_version_id is not None:
        result["router"] = retrain()
    log.info("undone: %s (%s)", version.action, version.summary)
    return result


def _clustering(indexes: reclustering.IndexManager, version: ExpertsVersion) -> reclustering.Clustering:
    """The clustering `version` kept, over the chunks stored now (those stored since: `commit` places them)."""
    assert version.layout is not None
    kept = np.load(io.BytesIO(version.layout))
    centroids, ids, lists = kept["centroids"], kept["ids"], kept["lists"]
    with indexes.sessions() as s:
        rows = s.execute(
            select(Chunk.id, Chunk.embedding, Chunk.document_id).where(Chunk.id.in_(ids.tolist())).order_by(Chunk.id)
        ).all()
    now = np.array([r[0] for r in rows], dtype=np.int64)
    assigned = lists[np.searchsorted(ids, now)] if len(now) else np.zeros(0, dtype=np.int64)  # [N]
    x = stack((r[1] for r in rows), indexes.dim)  # [N, D]
    k = len(centroids)
    fit = fits(x, centroids, assigned) if k > 1 else None
    by_id = {c["id"]: c for c in version.clusters}
    experts = reclustering.owners_of([by_id.get(c, {}).get("expert_id") for c in range(k)])
    return reclustering.Clustering(
        ids=now,
        x=x,
        documents=np.array([r[2] for r in rows], dtype=np.int64),
        centroids=centroids,
        assigned=assigned,
        keywords=[by_id.get(c, {}).get("keywords") or [] for c in range(k)],
        fit=fit,
        floor=floors(fit, assigned, k) if fit is not None else None,
        groups=experts,
    )


def undo_job(indexes: reclustering.IndexManager, routers: Any) -> Callable[[Any], dict[str, Any]]:
    """The `undo` job: `undo` with the router manager's activation and retraining."""

    def run(ctx: Any) -> dict[str, Any]:
        ctx.progress(0, 1)
        result = undo(indexes, routers.activate, lambda: routers.retrain())
        ctx.progress(1, 1)
        return result

    return run
