"""Recluster: k-means over the stored embeddings into new lists, experts carried over by vote.

The lists' fit floors, every chunk's fit and every document's fit (index.fit) are set in the same
transaction, with the id up to which the content is the fitted content, so the open-set check and
the drift report always read the clustering that is live.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session, sessionmaker

from app.clustering import expert_documents
from app.clustering import expert_history as history
from app.core.jobs import JobContext
from app.core.models import Chunk, Cluster, Document, Expert, IndexState, cluster_owners, stack
from app.core.settings import Settings
from app.store.sql_index import Progress
from engine.keywords import cluster_keywords
from index import ClusteredIndex, auto_cluster_count, kmeans
from index.fit import document_fits_within, fits, floors
from index.placement import held_groups, place


class IndexManager(Protocol):
    """What a recluster takes of the index replica (app.clustering.indexing.IndexManager, which
    calls `recluster` with itself): its database, settings and shape, its locks, and the two
    steps that hand it the new index."""

    @property
    def sessions(self) -> sessionmaker[Session]: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def dim(self) -> int: ...

    @property
    def codec(self) -> str: ...

    @property
    def write_lock(self) -> threading.RLock: ...

    def lock_clustering(self, s: Session, placed: str | None = None) -> IndexState: ...

    def stage(self, fresh: ClusteredIndex | None) -> None: ...

    def adopt(self, fresh: ClusteredIndex) -> None: ...

    def recluster(self, progress: Progress | None = None, clusters: int = 0) -> dict[str, Any]: ...


log = logging.getLogger(__name__)


def owners_of(experts: list[int | None]) -> np.ndarray:
    """[C] expert id per list, -1 where no expert owns it."""
    return np.array([-1 if e is None else e for e in experts], dtype=np.int64)


@dataclass
class Clustering:
    """A new clustering of every stored chunk, in memory until `commit` writes it.

    ids [N], x [N, D], documents [N] (each chunk's document), centroids [C, D], assigned [N]
    (each chunk's list after placement), keywords per list, fit [N] and floor [C] (index.fit;
    None: one list), groups [C] (which lists belong together: placement keeps a document in one).
    """

    ids: np.ndarray
    x: np.ndarray
    documents: np.ndarray
    centroids: np.ndarray
    assigned: np.ndarray
    keywords: list[list[str]]
    fit: np.ndarray | None
    floor: np.ndarray | None
    groups: np.ndarray

    @property
    def k(self) -> int:
        return len(self.centroids)


def cluster(indexes: IndexManager, x: np.ndarray, clusters: int) -> np.ndarray:
    """[N, D] -> [C, D] centroids: k-means into `clusters` lists (0: the setting, else automatic)."""
    k = auto_cluster_count(len(x), requested=clusters or indexes.settings.clusters)
    return kmeans(x, k, seed=indexes.settings.cluster_seed)


def lay_out(
    ids: np.ndarray,
    x: np.ndarray,
    documents: np.ndarray,
    texts: list[str],
    centroids: np.ndarray,
    groups: np.ndarray,
    pins: tuple[dict[int, int], set[int]] = ({}, set()),
) -> Clustering:
    """Place every chunk (a document inside one group of lists; `pins`: documents pinned to a
    group, the groups reserved to them, index.placement), with the lists' keywords and fits."""
    k = len(centroids)
    assigned = place(x, documents, centroids, groups, *pins)  # [N]
    keywords = cluster_keywords(texts, assigned, k)
    fit = fits(x, centroids, assigned)  # [N] or None (one list)
    floor = floors(fit, assigned, k) if fit is not None and k > 1 else None  # [C]
    return Clustering(ids, x, documents, centroids, assigned, keywords, fit, floor, groups)


def commit(
    indexes: IndexManager, c: Clustering, owners: Callable[[Session], list[int | None]]
) -> tuple[ClusteredIndex, int]:
    """Write clustering `c` in one transaction: lists (their expert from `owners`, called inside
    it), every chunk's list and fit; chunks written meanwhile by others are placed too. The new
    index is staged, then adopted. -> (the index, chunks placed). Call under `write_lock`."""
    fresh = ClusteredIndex.create(c.centroids, uuid.uuid4().hex, indexes.codec)
    fresh.add(c.x, c.ids, c.assigned)
    document_fit = document_fits_within(fresh, c.x, c.ids, c.documents)  # everything here is fitted content
    indexes.stage(fresh)  # adopted by `follow` when the commit below is applied
    try:
        with indexes.sessions.begin() as s:
            state = indexes.lock_clustering(s)  # other processes' writers wait from here to commit
            ids, assigned, fit = _reconcile(indexes, s, fresh, c.ids, c.assigned, c.fit, c.groups)
            experts = owners(s)
            s.execute(delete(Cluster))
            s.add_all(
                Cluster(
                    id=i,
                    centroid=c.centroids[i],
                    keywords=c.keywords[i],
                    expert_id=experts[i],
                    fit_floor=None if c.floor is None else float(c.floor[i]),
                )
                for i in range(c.k)
            )
            if len(ids):
                s.execute(  # ORM bulk UPDATE by primary key (one executemany)
                    update(Chunk),
                    [
                        {"id": int(i), "cluster_id": int(a), "fit": None if fit is None else float(f)}
                        for i, a, f in zip(ids, assigned, fit if fit is not None else ids, strict=True)
                    ],
                )
            present = set(s.scalars(select(Document.id)))
            if fitted := [{"id": d, "fit": f} for d, f in document_fit.items() if d in present]:
                s.execute(update(Document), fitted)
            state.version, state.nlist = fresh.version, c.k
            state.fitted_through = int(c.ids.max()) if len(c.ids) else None
    finally:
        indexes.stage(None)
    indexes.adopt(fresh)
    return fresh, len(ids)


def read_chunks(indexes: IndexManager) -> tuple[list[Any], dict[int, int | None]]:
    """(chunk rows: id, list, embedding, text, document, heading, fit margin; by id, {list: its expert})."""
    with indexes.sessions() as s:
        rows = s.execute(
            select(
                Chunk.id,
                Chunk.cluster_id,
                Chunk.embedding,
                Chunk.text,
                Chunk.document_id,
                Chunk.heading,
                Chunk.fit - Cluster.fit_floor,
            )
            .outerjoin(Cluster, Cluster.id == Chunk.cluster_id)
            .order_by(Chunk.id)
        ).all()
        owner = cluster_owners(s)
    return list(rows), owner


def recluster(indexes: IndexManager, clusters: int = 0, progress: Progress | None = None) -> dict[str, Any]:
    """k-means into `clusters` lists (0: the setting, else the automatic count); experts carry over
    by majority vote of the chunks; each document's chunks stay inside one expert's lists, and an
    owned expert keeps its documents (given lists of their own when the vote leaves it none)."""
    report = progress or (lambda done, total: None)
    with indexes.write_lock:
        rows, old_expert = read_chunks(indexes)
        report(1, 4)
        n = len(rows)
        ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=n)
        x = stack((r[2] for r in rows), indexes.dim)  # [N, D]
        centroids = cluster(indexes, x, clusters)  # [C, D]
        k = len(centroids)
        nearest = ClusteredIndex.create(centroids, "").assign(x)  # [N]
        report(2, 4)
        votes: list[Counter[int | None]] = [Counter() for _ in range(k)]
        for r, new_cluster in zip(rows, nearest, strict=True):
            votes[new_cluster][old_expert.get(r[1])] += 1
        experts = [v.most_common(1)[0][0] if v else None for v in votes]
        documents = np.fromiter((r[4] for r in rows), dtype=np.int64, count=n)
        with indexes.sessions() as s:
            where, reserved = expert_documents.pinned(s)  # documents of experts defined by them stay theirs
            owned = set(s.scalars(select(Expert.id).where(Expert.owned)))
        with indexes.sessions() as s:
            old_centroids = {c: centroid for c, centroid in s.execute(select(Cluster.id, Cluster.centroid))}
        held = {d: e for d, e in documents_held(rows, x, documents, old_expert, old_centroids).items() if e in owned}
        for e in sorted(set(held.values()) - {v for v in experts if v is not None}):  # outvoted: lists of its own
            mine = np.isin(documents, [d for d, owner in held.items() if owner == e])
            extra = kmeans(x[mine], auto_cluster_count(int(mine.sum())), seed=indexes.settings.cluster_seed)
            centroids = np.concatenate([centroids, extra]).astype(np.float32)
            experts += [e] * len(extra)
        k = len(centroids)
        pins = ({**held, **where}, reserved)
        layout = lay_out(ids, x, documents, [r[3] for r in rows], centroids, owners_of(experts), pins)
        report(3, 4)

        def owners(s: Session) -> list[int | None]:
            history.record(s, "recluster", f"reclustered into {k} lists", layout=True)
            return experts

        fresh, n = commit(indexes, layout, owners)
        report(4, 4)
    sizes = np.bincount(layout.assigned, minlength=k) if n else np.zeros(k, dtype=np.int64)
    log.info("reclustered %d chunks into %d clusters (version %s)", n, k, fresh.version)
    return {
        "chunks": n,
        "clusters": k,
        "version": fresh.version,
        "largest": int(sizes.max(initial=0)),
        "smallest": int(sizes.min(initial=0)),
    }


def documents_held(
    rows: list[Any], x: np.ndarray, documents: np.ndarray, expert_of: dict[int, int | None], centroids: dict[int, Any]
) -> dict[int, int]:
    """{document: the expert holding most of its chunks where they are now (-1: lists of no expert)}.

    rows: `read_chunks`' (r[1] each chunk's list), x [N, D], documents [N], expert_of {list: expert},
    centroids {list: centroid}; ties as placement's vote breaks them (index.placement.held_groups)."""
    if not centroids:
        return {}
    lists = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))  # [N]
    size = max(centroids) + 1
    dim = x.shape[1]
    table = stack((centroids.get(c, np.zeros(dim, dtype=np.float32)) for c in range(size)), dim)  # [C, D]
    return held_groups(x, documents, lists, table, owners_of([expert_of.get(c) for c in range(size)]))


class Routers(Protocol):
    """What a recluster job asks of the routers (app.services.routing.RouterManager): is one active?"""

    def current(self) -> object | None: ...


def recluster_job(indexes: IndexManager, routers: Routers) -> Callable[[JobContext], dict[str, Any]]:
    """The "recluster" job: `recluster` (params: clusters). The mapping is carried over by majority
    vote; an active router relearns it on the new clusters: the result's `train_job` is the
    training job it queued (`train_job`), absent when no router is active."""

    def run(ctx: JobContext) -> dict[str, Any]:
        result = indexes.recluster(ctx.progress, int(ctx.params.get("clusters") or 0))
        if routers.current() is not None and ctx.submit is not None:
            result["train_job"] = ctx.submit("train", {"activate": True}, total=100, coalesce=True).id
        return result

    return run


def _reconcile(
    indexes: IndexManager,
    s: Session,
    fresh: ClusteredIndex,
    ids: np.ndarray,
    assigned: np.ndarray,
    fit: np.ndarray | None,
    groups: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Chunks committed or deleted by other processes since a recluster read them: placed in
    (or removed from) the new clustering too. Under `lock_clustering`: nothing changes meanwhile."""
    now = dict(s.execute(select(Chunk.id, Chunk.document_id)).all())  # chunk id -> document id
    keep = np.fromiter((int(i) in now for i in ids), dtype=bool, count=len(ids))
    if not keep.all():
        fresh.remove(ids[~keep].tolist())
        ids, assigned = ids[keep], assigned[keep]
        fit = None if fit is None else fit[keep]
    extra = sorted(now.keys() - set(ids.tolist()))
    if extra:
        rows = s.execute(select(Chunk.id, Chunk.embedding).where(Chunk.id.in_(extra)).order_by(Chunk.id)).all()
        new_ids = np.array([r[0] for r in rows], dtype=np.int64)
        x = stack((r[1] for r in rows), indexes.dim)
        owners = np.array([now[int(i)] for i in new_ids], dtype=np.int64)
        placed = place(x, owners, fresh.centroids(), groups)
        fresh.add(x, new_ids, placed)
        ids, assigned = np.concatenate([ids, new_ids]), np.concatenate([assigned, placed])
        more = fits(x, fresh.centroids(), placed)
        fit = None if fit is None or more is None else np.concatenate([fit, more])
    return ids, assigned, fit
