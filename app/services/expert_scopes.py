"""Experts defined by their documents (ids, a source folder, a tag) as well as by clusters.

Such an expert's scope is lists fitted on its documents' chunks alone: `carve` replaces the
expert's lists by k-means lists of exactly those chunks and writes every chunk's list in one
transaction (reclustering.commit); the other experts keep their lists, less those chunks.
Placement keeps it that way (index.placement `pinned`): a matching document, stored later or
re-placed, goes into the expert's lists whatever its vectors vote, and no other document does.
A router is then trained and activated, as after a re-fit.

Which documents an expert is defined by: app.clustering.expert_documents.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from app.clustering import expert_documents, reclustering
from app.core.models import Expert, stack
from engine.errors import Conflict, NotFound
from index import auto_cluster_count, kmeans

if TYPE_CHECKING:
    from app.core.jobs import JobContext
    from app.services.routing import RouterManager

log = logging.getLogger(__name__)
Progress = Callable[[int, int], None]


def carve(indexes: Any, expert_id: int, progress: Progress | None = None) -> dict[str, Any]:
    """Replace expert `expert_id`'s lists by lists fitted on its documents' chunks; every other
    list keeps its centroid and expert. -> {documents, chunks, lists, version}. Takes `write_lock`."""
    report = progress or (lambda done, total: None)
    with indexes.write_lock:
        rows, owner = reclustering.read_chunks(indexes)
        with indexes.sessions() as s:
            if s.get(Expert, expert_id) is None:
                raise NotFound(f"expert {expert_id} not found")
            where, reserved = expert_documents.pinned(s)
        mine = [d for d, e in where.items() if e == expert_id]
        if not mine:
            raise Conflict(f"no stored document matches expert {expert_id}'s documents: nothing to scope")
        report(1, 3)
        n = len(rows)
        ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=n)
        x = stack((r[2] for r in rows), indexes.dim)  # [N, D]
        documents = np.fromiter((r[4] for r in rows), dtype=np.int64, count=n)
        own = np.isin(documents, mine)  # [N]
        index = indexes.index
        others = [c for c in range(index.nlist) if owner.get(c) != expert_id] if index.nlist > 1 else []
        base, experts = index.centroids()[others], [owner.get(c) for c in others]  # [C0, D]: the others' lists
        if not others and not own.all():  # one list (too small to cluster) or all the expert's: the rest
            base = reclustering.cluster(indexes, x[~own], 0)
            experts = [None] * len(base)
        k = auto_cluster_count(int(own.sum()))
        carved = kmeans(x[own], k, seed=indexes.settings.cluster_seed)  # [K, D]
        centroids = np.concatenate([base, carved]).astype(np.float32)  # [C, D]
        experts += [expert_id] * len(carved)
        report(2, 3)
        layout = reclustering.lay_out(
            ids, x, documents, [r[3] for r in rows], centroids, reclustering.owners_of(experts), (where, reserved)
        )
        fresh, _ = reclustering.commit(indexes, layout, lambda s: experts)
        report(3, 3)
    result = {"documents": len(mine), "chunks": int(own.sum()), "lists": len(carved), "version": fresh.version}
    log.info("expert %d scoped to its documents: %s", expert_id, result)
    return result


def scope_handler(indexes: Any, routers: RouterManager) -> Callable[[JobContext], dict[str, Any]]:
    """The `scope` job (params: expert_id): carve the expert's lists, then train and activate a
    router when there are experts to route between."""

    def run(ctx: JobContext) -> dict[str, Any]:
        result = carve(indexes, int(ctx.params["expert_id"]), lambda done, total: ctx.progress(done * 50 // total, 100))
        result["router"] = routers.retrain(lambda d, t: ctx.progress(50 + d * 50 // max(t, 1), 100))
        return result

    return run
