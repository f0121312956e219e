"""Keep the FAISS index in step with SQL: open, verify, rebuild, checkpoint, recluster."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from app.clustering import expert_documents
from app.clustering.reclustering import owners_of, recluster
from app.core.models import Chunk, Cluster, Expert, IndexState, cluster_owners, stack
from app.core.settings import Settings
from app.store import index_log
from app.store.catalogue import read_version
from app.store.snapshots import SnapshotStore
from app.store.sql_index import Progress, assignments, index_from_sql, list_map_from_sql
from engine.errors import IndexMoved
from index import ClusteredIndex, IndexCorrupt
from index.fit import document_fit, fits
from index.list_map import ListMap
from index.placement import held_groups, leakage, outside, place
from index.shards import shard_failures

log = logging.getLogger(__name__)


class ModelMismatch(RuntimeError):
    pass


class Placement(NamedTuple):
    """Where one document's chunks go: lists [N], their fits [N] (None: unknown) and the
    document's fit against the fitted content (index.fit; None: unknown)."""

    lists: np.ndarray
    fits: list[float | None]
    document_fit: float | None


class IndexManager:
    """Owns this process's replica of the index and keeps it equal to SQL by following the index log.

    `write_lock` serialises this process's changes to chunks, clusters and index. Writers never
    touch the replica: they stage index changes in their transaction (`index_log.stage`);
    the commit writes them to the index log with the catalogue version it bumps, and `follow`
    (a catalogue subscriber, run in this process before the commit returns, and in every other
    process when it sees the version) applies the log. `position` is the catalogue version the
    replica holds; snapshots are named by clustering version and position, so a process boots
    from the newest one and replays the log after it.

    Locks, always taken in this order: `write_lock`, the catalogue's, `_replica_lock` (held only
    around reads and in-memory swaps: never across a commit).
    """

    def __init__(
        self,
        settings: Settings,
        sessions: sessionmaker[Session],
        dim: int,
        model: str,
        vectors: bool = True,
        *,
        snapshot_writer: Callable[[], bool] = lambda: True,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.dim = dim
        self.model = model
        self.write_lock = threading.RLock()
        self.codec = settings.index_codec  # how the index stores vectors (flat, sq8)
        # vectors=False (the shards hold them): a ListMap from SQL, never a snapshot; the vectors are
        # searched over the shards (app.serving.states.ServingStates.search_index).
        self.vectors = vectors
        self.index: ClusteredIndex | ListMap = ClusteredIndex.single(dim, "unopened", self.codec)
        self.position = 0  # the catalogue version this replica holds
        self._dirty = False  # the index changed since it was last written
        self._staged: ClusteredIndex | None = None  # a recluster's index, adopted when its commit is followed
        self._replica_lock = threading.RLock()
        # Checkpoints take turns: a caller returns only once any snapshot already being written is on
        # disk (the checkpoint thread's, or another caller's), so "checkpointed" means written.
        self._checkpoint_lock = threading.Lock()
        # Whether this process writes snapshot files (several processes on one database: one of them).
        self.snapshot_writer = snapshot_writer
        self.store = SnapshotStore(settings.index_dir, settings.snapshot_url)  # where snapshots live
        self.written: int | None = None  # the position of the newest snapshot this process wrote

    def snapshots(self, version: str) -> list[tuple[int, str]]:
        """(position, location) of the clustering's snapshots in the snapshot store, newest last."""
        return self.store.list(version)

    # ---- start-up -----------------------------------------------------------------------------

    def _ensure_state(self, s: Session) -> IndexState:
        state = s.get(IndexState, 1)
        if state is None:
            try:
                with s.begin_nested():  # workers starting together on a new database: one creates it
                    s.add(IndexState(id=1, version=uuid.uuid4().hex, nlist=1, dim=self.dim, model=self.model))
                    s.add(Cluster(id=0, centroid=np.zeros(self.dim, dtype=np.float32), keywords=[]))
            except IntegrityError:
                pass
            state = s.get(IndexState, 1, populate_existing=True)
            assert state is not None
        if state.dim != self.dim or state.model != self.model:
            raise ModelMismatch(
                f"the database holds embeddings of model {state.model!r} (dim {state.dim}) but the "
                f"configured model is {self.model!r} (dim {self.dim}); point MOERAG_MODEL_PATH at the "
                "original model or start from a new data directory"
            )
        return state

    def _read_newest(self, version: str, snapshots: list[tuple[int, str]]) -> tuple[int, bytes]:
        """(position, bytes) of the newest snapshot. Another process's writer may put a newer one in
        place and remove this one between the listing and the read: the listing is then read again
        (a few times) before the snapshot counts as unreadable."""
        for _ in range(3):
            position, where = snapshots[-1]
            try:
                return position, self.store.read(where)
            except FileNotFoundError as exc:
                fresh = self.snapshots(version)
                if not fresh or fresh[-1][1] == where:
                    raise IndexCorrupt(f"cannot read {where}: {exc}") from exc
                snapshots = fresh
            except OSError as exc:
                raise IndexCorrupt(f"cannot read {where}: {exc}") from exc
        raise IndexCorrupt("the newest snapshot was replaced three times while it was read")

    def open(self) -> str:
        """Load the newest snapshot, replay the index log after it and check the result against SQL
        exactly; anything missing, corrupt or different: rebuild from SQL."""
        with self.write_lock:
            with self.sessions.begin() as s:
                state = self._ensure_state(s)
                version, nlist = state.version, state.nlist
                empty = (s.scalar(select(func.count(Chunk.id))) or 0) == 0
            if not self.vectors:  # the assignments alone, from SQL: no snapshot holds them apart
                self.rebuild()
                return "lists only"
            snapshots = self.snapshots(version)
            if not snapshots and empty:
                self.rebuild()  # a new store: nothing to distrust
                return "created"
            try:
                if not snapshots:
                    raise IndexCorrupt(f"no index snapshot for version {version}")
                position, data = self._read_newest(version, snapshots)
                with self.sessions() as s:
                    if position < index_log.horizon(s):
                        raise IndexCorrupt(f"the snapshot at {position} is older than the compacted index log")
                loaded = ClusteredIndex.from_bytes(data, version)
                if loaded.nlist != nlist or loaded.dim != self.dim or loaded.codec != self.codec:
                    raise IndexCorrupt(
                        f"index has {loaded.nlist} lists of dim {loaded.dim} stored {loaded.codec}, "
                        f"expected {nlist}/{self.dim}/{self.codec} (MOERAG_INDEX_CODEC)"
                    )
                with self._replica_lock:
                    self.index, self.position = loaded, position
                with self.sessions() as s:
                    now = read_version(s)
                self.follow(now)  # the log after the snapshot
                with self.sessions() as s:
                    db_ids, db_clusters = assignments(s)
                ix_ids, ix_clusters = self.index.assignments()
                if not (np.array_equal(ix_ids, db_ids) and np.array_equal(ix_clusters, db_clusters)):
                    raise IndexCorrupt(
                        f"index holds {len(ix_ids)} vectors, the database {len(db_ids)} chunks, or they differ"
                    )
            except IndexCorrupt as exc:
                log.warning("index not trusted (%s): rebuilding from stored embeddings", exc)
                self.rebuild()
                return f"rebuilt: {exc}"
        self._remove_stale_files()
        idx = self.index
        log.info("index %s loaded at version %d: %d vectors, %d lists", version, self.position, idx.ntotal, idx.nlist)
        return "loaded"

    def rebuild(self, progress: Progress | None = None) -> ClusteredIndex | ListMap:
        """Recreate the index from the clusters' centroids and the chunks' stored embeddings."""
        with self.write_lock:
            with self.sessions.begin() as s:
                self._ensure_state(s)
            with self._replica_lock:
                fresh, position = self._build_from_sql(progress)
                self.index, self.position, self._dirty = fresh, position, False
            if self.snapshot_writer() and isinstance(fresh, ClusteredIndex):
                self.store.write(fresh.version, position, fresh.serialized())
                self.written = position
                self._remove_stale_files()
        log.info("index %s rebuilt: %d vectors in %d clusters", fresh.version, fresh.ntotal, fresh.nlist)
        return fresh

    def _build_from_sql(self, progress: Progress | None = None) -> tuple[ClusteredIndex | ListMap, int]:
        """(an index of every stored chunk, or its ListMap, the catalogue version it holds at least); reads only."""
        with self.sessions() as s:
            position = read_version(s)  # rows read below are this version or later (replays are idempotent)
            if not self.vectors:
                return list_map_from_sql(s, self.dim), position
            return index_from_sql(s, self.dim, progress=progress, codec=self.codec), position

    def search_index(self) -> Any:
        """What searches the vectors here: this replica, else a one-off index from SQL (over shards,
        the serving state's lists searched there: app.serving.states.ServingStates.search_index)."""
        if isinstance(self.index, ClusteredIndex):
            return self.index
        with self.sessions() as s:
            return index_from_sql(s, self.dim, codec=self.codec)

    # ---- checkpoints ----------------------------------------------------------------------------

    def checkpoint(self) -> bool:
        """Write a snapshot if the replica changed since the last one, then compact the index log it
        covers (past the retention). SQL stays the truth meanwhile."""
        if not self.snapshot_writer():
            return False
        with self._checkpoint_lock:
            written = self._checkpoint()
        if written:
            self.compact_log(self.settings.index_log_retention_seconds)
        return written

    def _checkpoint(self) -> bool:
        with self._replica_lock:
            if not self._dirty:
                return False
            if isinstance(self.index, ListMap):  # nothing to write: the log it followed may go
                self.written, self._dirty = self.position, False
                return True
            data, version, position = self.index.serialized(), self.index.version, self.position
            self._dirty = False
        try:
            self.store.write(version, position, data)
            self.written = position
        except OSError:  # a full disk: SQL holds everything; the next checkpoint writes again
            with self._replica_lock:
                self._dirty = True
            raise
        self._remove_stale_files()
        return True

    def compact_log(self, retention_seconds: float) -> int:
        """After this process wrote a snapshot: drop the log it covers (and older than retention)."""
        if self.written is None:
            return 0
        with self.sessions.begin() as s:
            return index_log.compact(s, self.written, retention_seconds)

    def _remove_stale_files(self) -> None:
        self.store.remove_stale(self.index.version)

    def follow(self, version: int, parts: object = None) -> None:
        """Bring the replica to catalogue `version` (a catalogue subscriber): apply the index log
        after `position`, or, when the clustering changed, adopt this process's recluster or
        rebuild from SQL."""
        with self._replica_lock:
            if version <= self.position:
                return
            with self.sessions() as s:
                state = s.get(IndexState, 1)
                if state is None:
                    return
                carried = index_log.carries(s, self.index.version, self.position)
                changes = index_log.read_log(s, self.position, version, self.dim, self.vectors) if carried else None
            if changes is not None:
                index_log.apply_log(self.index, changes)
                self.position, self._dirty = version, self._dirty or bool(changes.touched)
                return
            staged, self._staged = self._staged, None
            if staged is not None and staged.version == state.version:  # this process's recluster
                self.index, self.position, self._dirty = staged if self.vectors else ListMap.of(staged), version, True
                return
            log.info("clustering %s is live elsewhere: rebuilding this replica from SQL", state.version)
            self.index, self.position = self._build_from_sql()
            self._dirty = True

    # ---- writers, across processes ------------------------------------------------------------------

    def lock_clustering(self, s: Session, placed: str | None = None) -> IndexState:
        """First statement of every transaction that changes chunks or clusters: the index_state row,
        locked until commit (PostgreSQL; SQLite has one writer at a time anyway), so index writers of
        all processes take turns and a lock holder that dies releases it with its connection.
        `placed`: the clustering the new chunks were placed in; IndexMoved if it is no longer live."""
        state = s.scalars(select(IndexState).where(IndexState.id == 1).with_for_update()).one()
        if placed is not None and state.version != placed:
            raise IndexMoved(f"the index was reclustered (now {state.version}) while chunks were placed in {placed}")
        return state

    # ---- placement: a document's chunks stay in one expert's lists ---------------------------------

    def groups(self) -> np.ndarray:
        """[C] the expert owning each list of the live index (-1: none), read from SQL."""
        with self.sessions() as s:
            owned = cluster_owners(s)
        return owners_of([owned.get(c) for c in range(self.index.nlist)])

    def place_document(
        self,
        vectors: np.ndarray,
        source: str,
        meta: Any = None,
        document_id: int | None = None,
        *,
        search: Any = None,
    ) -> Placement:
        """One document's chunk vectors [N, D] -> its lists, chunk fits and document fit; under
        `write_lock`. A document an expert is defined by goes into that expert's lists. `search`:
        what the document's fit is measured on (default `search_index()`)."""
        with self.sessions() as s:  # changes only with the clustering, which the commit checks
            through = s.scalar(select(IndexState.fitted_through).where(IndexState.id == 1))
            selectors = expert_documents.defined(s)
        if self.index.nlist == 1 or len(vectors) == 0:
            lists = self.index.assign(vectors)
        else:
            owners = np.zeros(len(vectors), dtype=np.int64)
            expert = expert_documents.expert_for(selectors, document_id, source, meta)
            pins = {0: expert} if expert is not None else {}
            lists = place(vectors, owners, self.index.centroids(), self.groups(), pins, set(selectors))
        with shard_failures() as missed:  # over shards: a fit that misses a shard's chunks is unknown
            fit = document_fit(search or self.search_index(), vectors, through) if through is not None else None
        return Placement(lists, self.fits_of(vectors, lists), None if missed else fit)

    def fits_of(self, vectors: np.ndarray, lists: np.ndarray) -> list[float | None]:
        """[N] each vector's fit in its list of the live index (index.fit; None: unknown, one list)."""
        fit = fits(vectors, self.index.centroids(), lists) if self.index.nlist > 1 else None
        return [None] * len(lists) if fit is None else [float(f) for f in fit]

    def realign(self, progress: Progress | None = None) -> dict[str, Any]:
        """Re-place every chunk after the cluster -> expert mapping changed; moves only what must move,
        and never a document an owned expert holds (app.core.models.Expert.owned) out of its lists."""
        report = progress or (lambda done, total: None)
        with self.write_lock:
            groups = self.groups()
            with self.sessions() as s:
                rows = s.execute(
                    select(Chunk.id, Chunk.document_id, Chunk.cluster_id, Chunk.embedding).order_by(Chunk.id)
                ).all()
                pins = expert_documents.pinned(s)
                owned = set(s.scalars(select(Expert.id).where(Expert.owned)))
            report(1, 3)
            n = len(rows)
            ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=n)
            owners = np.fromiter((r[1] for r in rows), dtype=np.int64, count=n)
            before = np.fromiter((r[2] for r in rows), dtype=np.int64, count=n)
            x = stack((r[3] for r in rows), self.dim)
            leak_before = leakage(owners, before, groups)
            # An owned expert's documents stay in its lists (they follow a list the operator moved).
            centroids = self.index.centroids()
            held = {d: g for d, g in held_groups(x, owners, before, centroids, groups).items() if g in owned}
            pinned = ({**held, **pins[0]}, pins[1])
            after = place(x, owners, self.index.centroids(), groups, *pinned) if self.index.nlist > 1 else before
            moved = np.flatnonzero(after != before)
            report(2, 3)
            if moved.size:
                with self.sessions.begin() as s:
                    self.lock_clustering(s, self.index.version)  # a recluster meanwhile placed them already
                    fit = self.fits_of(x[moved], after[moved])
                    s.execute(  # ORM bulk UPDATE by primary key (one executemany)
                        update(Chunk),
                        [
                            {"id": int(ids[i]), "cluster_id": int(after[i]), "fit": f}
                            for i, f in zip(moved, fit, strict=True)
                        ],
                    )
                    index_log.stage(s, ((int(ids[i]), int(after[i])) for i in moved))
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

    # ---- recluster (app.clustering.reclustering) ------------------------------------------------------

    def recluster(self, progress: Progress | None = None, clusters: int = 0) -> dict[str, Any]:
        """k-means into `clusters` lists (0: the setting's count, else automatic); see app.clustering.reclustering."""
        return recluster(self, clusters, progress)

    def stage(self, fresh: ClusteredIndex | None) -> None:
        """A recluster's index, adopted by `follow` when its commit is applied (None: done)."""
        self._staged = fresh

    def adopt(self, fresh: ClusteredIndex) -> None:
        """After a recluster's commit: its index is the replica (if `follow` did not adopt it), checkpointed;
        without vectors here, written whole once (the new clustering's shards boot from it), kept as a ListMap."""
        with self._replica_lock:
            if self.index.version != fresh.version:  # not followed (no catalogue subscription): adopt it here
                self.index, self._dirty = fresh if self.vectors else ListMap.of(fresh), True
            position = self.position
        if not self.vectors and self.snapshot_writer():
            self.store.write(fresh.version, position, fresh.serialized())
            self._remove_stale_files()  # the old clustering's snapshots and parts
        self.checkpoint()
