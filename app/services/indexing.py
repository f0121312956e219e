"""Keep the FAISS index in step with SQL: open, verify, rebuild, checkpoint, recluster."""

from __future__ import annotations

import logging
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from app.models import Chunk, Cluster, IndexState, stack
from app.settings import Settings
from engine.keywords import cluster_keywords
from index import ClusteredIndex, IndexCorrupt, auto_cluster_count, kmeans
from index.placement import leakage, outside, place
from index.store import write_atomic

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
_BATCH = 10_000


class ModelMismatch(RuntimeError):
    pass


class IndexManager:
    """Owns the live index. `write_lock` serialises every change to chunks, clusters and index."""

    def __init__(self, settings: Settings, sessions: sessionmaker[Session], dim: int, model: str) -> None:
        self.settings = settings
        self.sessions = sessions
        self.dim = dim
        self.model = model
        self.write_lock = threading.RLock()
        self.index: ClusteredIndex = ClusteredIndex.single(dim, "unopened")
        self._dirty = False  # the index changed since it was last written

    def path_for(self, version: str) -> Path:
        return self.settings.index_dir / f"ivf-{version}.faiss"

    # ---- start-up -----------------------------------------------------------------------------

    def _ensure_state(self, s: Session) -> IndexState:
        state = s.get(IndexState, 1)
        if state is None:
            state = IndexState(id=1, version=uuid.uuid4().hex, nlist=1, dim=self.dim, model=self.model)
            s.add(state)
            s.add(Cluster(id=0, centroid=np.zeros(self.dim, dtype=np.float32), keywords=[]))
            s.flush()
        elif state.dim != self.dim or state.model != self.model:
            raise ModelMismatch(
                f"the database holds embeddings of model {state.model!r} (dim {state.dim}) but the "
                f"configured model is {self.model!r} (dim {self.dim}); point MOERAG_MODEL_PATH at the "
                "original model or start from a new data directory"
            )
        return state

    def open(self) -> str:
        """Load the index file if it matches the database exactly; otherwise rebuild it from SQL."""
        with self.write_lock, self.sessions.begin() as s:
            state = self._ensure_state(s)
            version, nlist = state.version, state.nlist
            db_ids, db_clusters = _assignments(s)
        path = self.path_for(version)
        if not path.exists() and len(db_ids) == 0:
            self.rebuild()  # a new store: nothing to distrust
            return "created"
        try:
            if not path.exists():
                raise IndexCorrupt(f"no index file for version {version}")
            loaded = ClusteredIndex.load(path, version)
            if loaded.nlist != nlist or loaded.dim != self.dim:
                raise IndexCorrupt(f"index has {loaded.nlist} lists of dim {loaded.dim}, expected {nlist}/{self.dim}")
            ix_ids, ix_clusters = loaded.assignments()
            if not (np.array_equal(ix_ids, db_ids) and np.array_equal(ix_clusters, db_clusters)):
                raise IndexCorrupt(
                    f"index holds {len(ix_ids)} vectors, the database {len(db_ids)} chunks, or they differ"
                )
        except IndexCorrupt as exc:
            log.warning("index not trusted (%s): rebuilding from stored embeddings", exc)
            self.rebuild()
            return f"rebuilt: {exc}"
        with self.write_lock:
            self.index = loaded
        self._remove_stale_files(version)
        log.info("index %s loaded: %d vectors in %d clusters", version, loaded.ntotal, loaded.nlist)
        return "loaded"

    def rebuild(self, progress: Progress | None = None) -> ClusteredIndex:
        """Recreate the index from the clusters' centroids and the chunks' stored embeddings."""
        with self.write_lock:
            with self.sessions() as s:
                state = self._ensure_state(s)
                s.commit()
                centroids = _centroids(s, state.nlist, self.dim)
                fresh = ClusteredIndex.create(centroids, state.version)
                total = s.scalar(select(func.count(Chunk.id))) or 0
                done = 0
                rows = s.execute(select(Chunk.id, Chunk.cluster_id, Chunk.embedding).order_by(Chunk.id))
                for batch in rows.partitions(_BATCH):
                    ids = np.fromiter((r[0] for r in batch), dtype=np.int64)
                    clusters = np.fromiter((r[1] for r in batch), dtype=np.int64)
                    x = stack((r[2] for r in batch), self.dim)
                    fresh.add(x, ids, clusters)
                    done += len(batch)
                    if progress:
                        progress(done, total)
            self.index = fresh
            self._dirty = False
            fresh.save(self.path_for(fresh.version))
        self._remove_stale_files(fresh.version)
        log.info("index %s rebuilt: %d vectors in %d clusters", fresh.version, fresh.ntotal, fresh.nlist)
        return fresh

    # ---- checkpoints ----------------------------------------------------------------------------

    def mark_dirty(self) -> None:
        """The in-memory index changed: the next checkpoint writes it."""
        self._dirty = True

    def checkpoint(self) -> bool:
        """Write the index if it changed since the last write. SQL stays the truth meanwhile."""
        with self.write_lock:
            if not self._dirty:
                return False
            data, version = self.index.to_bytes(), self.index.version
            self._dirty = False
        try:
            write_atomic(self.path_for(version), data)
        except OSError:  # a full disk: SQL holds everything; the next checkpoint writes again
            with self.write_lock:
                self._dirty = True
            raise
        return True

    def _remove_stale_files(self, keep: str) -> None:
        if not self.settings.index_dir.exists():
            return
        for p in self.settings.index_dir.glob("ivf-*.faiss"):
            if p.name != self.path_for(keep).name:
                p.unlink(missing_ok=True)

    # ---- placement: a document's chunks stay in one expert's lists ---------------------------------

    def groups(self) -> np.ndarray:
        """[C] the expert owning each list of the live index (-1: none), read from SQL."""
        with self.sessions() as s:
            owned: dict[int, int | None] = {c: e for c, e in s.execute(select(Cluster.id, Cluster.expert_id))}
        return _groups([owned.get(c) for c in range(self.index.nlist)])

    def place_document(self, vectors: np.ndarray) -> np.ndarray:
        """[N] lists for one document's chunk vectors [N, D]; call under `write_lock`."""
        if self.index.nlist == 1 or len(vectors) == 0:
            return self.index.assign(vectors)
        owners = np.zeros(len(vectors), dtype=np.int64)
        return place(vectors, owners, self.index.centroids(), self.groups())

    def realign(self, progress: Progress | None = None) -> dict[str, Any]:
        """Re-place every chunk after the cluster -> expert mapping changed; moves only what must move."""
        report = progress or (lambda done, total: None)
        with self.write_lock:
            groups = self.groups()
            with self.sessions() as s:
                rows = s.execute(
                    select(Chunk.id, Chunk.document_id, Chunk.cluster_id, Chunk.embedding).order_by(Chunk.id)
                ).all()
            report(1, 3)
            n = len(rows)
            ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=n)
            owners = np.fromiter((r[1] for r in rows), dtype=np.int64, count=n)
            before = np.fromiter((r[2] for r in rows), dtype=np.int64, count=n)
            x = stack((r[3] for r in rows), self.dim)
            leak_before = leakage(owners, before, groups)
            after = place(x, owners, self.index.centroids(), groups) if self.index.nlist > 1 else before
            moved = np.flatnonzero(after != before)
            report(2, 3)
            if moved.size:
                with self.sessions.begin() as s:
                    s.execute(  # ORM bulk UPDATE by primary key (one executemany)
                        update(Chunk), [{"id": int(ids[i]), "cluster_id": int(after[i])} for i in moved]
                    )
                self.index.remove(ids[moved].tolist())
                self.index.add(x[moved], ids[moved], after[moved])
                self.mark_dirty()
            report(3, 3)
        result = {
            "chunks": n,
            "moved": int(moved.size),
            "leakage_before": round(leak_before, 4),
            "leakage_after": round(leakage(owners, after, groups), 4),
        }
        log.info("realigned chunks to their documents' experts: %s", result)
        return result

    def scope_leakage(self) -> dict[str, Any]:
        """Chunks outside the expert that holds most of their document (0 after a realign), per cluster."""
        with self.sessions() as s:
            rows = s.execute(select(Chunk.document_id, Chunk.cluster_id)).all()
        owners = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        clusters = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
        groups = self.groups()
        if len(rows) == 0 or clusters.max() >= len(groups):
            return {"share": 0.0, "chunks_outside": 0, "per_cluster": {}}
        out = outside(owners, clusters, groups)  # [N]
        per = np.bincount(clusters[out], minlength=len(groups))
        return {
            "share": round(float(out.mean()), 4),
            "chunks_outside": int(out.sum()),
            "per_cluster": {int(c): int(n) for c, n in enumerate(per) if n},
        }

    # ---- recluster ---------------------------------------------------------------------------------

    def recluster(self, progress: Progress | None = None) -> dict[str, Any]:
        """k-means over the stored embeddings; experts carry over by majority vote of the chunks."""
        report = progress or (lambda done, total: None)
        with self.write_lock:
            with self.sessions() as s:
                rows = s.execute(
                    select(Chunk.id, Chunk.cluster_id, Chunk.embedding, Chunk.text, Chunk.document_id).order_by(
                        Chunk.id
                    )
                ).all()
                old_expert = {c: e for c, e in s.execute(select(Cluster.id, Cluster.expert_id))}
            report(1, 4)
            n = len(rows)
            ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=n)
            x = stack((r[2] for r in rows), self.dim)
            k = auto_cluster_count(n, requested=self.settings.clusters)
            centroids = kmeans(x, k)  # [C, D]
            fresh = ClusteredIndex.create(centroids, uuid.uuid4().hex)
            nearest = fresh.assign(x)  # [N]
            report(2, 4)
            votes: list[Counter[int | None]] = [Counter() for _ in range(k)]
            for (_, old_cluster, _, _, _), new_cluster in zip(rows, nearest, strict=True):
                votes[new_cluster][old_expert.get(old_cluster)] += 1
            experts = [v.most_common(1)[0][0] if v else None for v in votes]
            # Each document's chunks stay inside one expert's lists (see index.placement).
            owners = np.fromiter((r[4] for r in rows), dtype=np.int64, count=n)
            assigned = place(x, owners, centroids, _groups(experts))  # [N]
            keywords = cluster_keywords([r[3] for r in rows], assigned, k)
            report(3, 4)
            with self.sessions.begin() as s:
                state = self._ensure_state(s)
                s.execute(delete(Cluster))
                s.add_all(
                    Cluster(id=c, centroid=centroids[c], keywords=keywords[c], expert_id=experts[c]) for c in range(k)
                )
                if n:
                    s.execute(  # ORM bulk UPDATE by primary key (one executemany)
                        update(Chunk),
                        [{"id": int(i), "cluster_id": int(c)} for i, c in zip(ids, assigned, strict=True)],
                    )
                state.version, state.nlist = fresh.version, k
            fresh.add(x, ids, assigned)
            self.index = fresh
            self._dirty = False
            fresh.save(self.path_for(fresh.version))
            report(4, 4)
        self._remove_stale_files(fresh.version)
        sizes = np.bincount(assigned, minlength=k) if n else np.zeros(k, dtype=np.int64)
        log.info("reclustered %d chunks into %d clusters (version %s)", n, k, fresh.version)
        return {"chunks": n, "clusters": k, "version": fresh.version, "largest": int(sizes.max(initial=0))}


def _groups(experts: list[int | None]) -> np.ndarray:
    """[C] expert id per list, -1 where no expert owns it."""
    return np.array([-1 if e is None else e for e in experts], dtype=np.int64)


def _assignments(s: Session) -> tuple[np.ndarray, np.ndarray]:
    rows = s.execute(select(Chunk.id, Chunk.cluster_id).order_by(Chunk.id)).all()
    ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    clusters = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
    return ids, clusters


def _centroids(s: Session, nlist: int, dim: int) -> np.ndarray:
    rows = s.execute(select(Cluster.id, Cluster.centroid).order_by(Cluster.id)).all()
    if [r[0] for r in rows] != list(range(nlist)):
        raise RuntimeError(f"cluster table does not hold lists 0..{nlist - 1}; run `moerag recluster`")
    return stack((r[1] for r in rows), dim)
