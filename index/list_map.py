"""The index without its vectors: which list holds each chunk, and the lists' centroids.

What a server over expert shards keeps of the index (index.shards holds the vectors on the
shards): enough to place new chunks (nearest centroid), to say which list and shard holds an id,
and to follow the index log, at 16 bytes a chunk against 1.5 kB for a 384-d float32 vector.
Its arrays are replaced, never changed in place, on each write: a `ShardedIndex` built from one
version keeps reading that version while the next is applied.
"""

from __future__ import annotations

from collections.abc import Iterable

import faiss
import numpy as np
import numpy.typing as npt

from index.store import ClusteredIndex, nearest_of

Floats = npt.NDArray[np.float32]
Ints = npt.NDArray[np.int64]


class ListFacts:
    """One version's centroids [C, D] and, sorted by id, chunk ids [N], their lists [N] and the
    vectors per list [C]: `ClusteredIndex`'s facts, read-only (`ListMap` adds the writes,
    `index.shards.ShardedIndex` the searches over shards)."""

    def __init__(self, centroids: Floats, version: str, view: tuple[Ints, Ints, Ints]) -> None:
        self._centroids = np.ascontiguousarray(centroids, dtype=np.float32)  # [C, D]
        self._centroids.setflags(write=False)
        self.version = version
        self.writes = 0
        self._view = view  # (ids [N] sorted, lists [N], sizes [C]), replaced whole: read as one version

    @staticmethod
    def view_of(ids: Ints, lists: Ints, nlist: int) -> tuple[Ints, Ints, Ints]:
        """(ids, lists) sorted by id -> the read-only view, with the vectors per list counted."""
        if lists.size and (lists.min() < 0 or lists.max() >= nlist):
            raise ValueError(f"cluster out of range 0..{nlist - 1}")
        sizes = np.bincount(lists, minlength=nlist).astype(np.int64)  # [C]
        for a in (ids, lists, sizes):
            a.setflags(write=False)
        return ids, lists, sizes

    @property
    def dim(self) -> int:
        return int(self._centroids.shape[1])

    @property
    def nlist(self) -> int:
        return len(self._centroids)

    @property
    def ntotal(self) -> int:
        return int(self._view[0].size)

    def centroids(self) -> Floats:
        return self._centroids

    def view(self) -> tuple[Ints, Ints, Ints]:
        """(ids [N] sorted, their lists [N], vectors per list [C]) of one version: read-only arrays
        that later writes replace, never change."""
        return self._view

    def list_sizes(self) -> Ints:
        return self._view[2]

    def assignments(self) -> tuple[Ints, Ints]:
        return self._view[0], self._view[1]

    def clusters_of(self, ids: Ints) -> Ints:
        sorted_ids, lists, _ = self._view
        ids = np.asarray(ids, dtype=np.int64)
        if sorted_ids.size == 0:
            return np.full(ids.shape, -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(sorted_ids, ids), sorted_ids.size - 1)
        return np.where(sorted_ids[pos] == ids, lists[pos], -1)

    def _valid_lists(self, clusters: Iterable[int]) -> Ints:
        lists = np.unique(np.fromiter(clusters, dtype=np.int64))
        return lists[(lists >= 0) & (lists < self.nlist)]

    def scan_size(self, clusters: Iterable[int] | None = None) -> tuple[int, int]:
        if clusters is None:
            return self.nlist, self.ntotal
        lists = self._valid_lists(clusters)
        return len(lists), int(self._view[2][lists].sum())

    def probe_budget(self, wanted: int) -> int:
        return max(0, min(wanted, self.nlist // 8))

    def nearest_lists(self, q: Floats, clusters: Iterable[int], nprobe: int) -> Ints:
        return nearest_of(self._centroids, q, self._valid_lists(clusters), nprobe)


class ListMap(ListFacts):
    """`ListFacts` that follow writes as `ClusteredIndex` takes them (`add` ignores the vectors); no search."""

    codec = "none"  # stores no vectors

    def __init__(self, centroids: Floats, version: str, ids: Ints | None = None, lists: Ints | None = None) -> None:
        ids = np.zeros(0, dtype=np.int64) if ids is None else np.asarray(ids, dtype=np.int64)
        lists = np.zeros(0, dtype=np.int64) if lists is None else np.asarray(lists, dtype=np.int64)
        order = np.argsort(ids, kind="stable")
        super().__init__(centroids, version, self.view_of(ids[order], lists[order], len(centroids)))

    @classmethod
    def of(cls, index: ClusteredIndex) -> ListMap:
        """`index`'s lists and assignments, without its vectors."""
        ids, lists = index.assignments()
        return cls(index.centroids(), index.version, ids, lists)

    def _set(self, ids: Ints, lists: Ints) -> None:
        self._view = self.view_of(ids, lists, self.nlist)
        self.writes += 1

    # ---- writes, as ClusteredIndex --------------------------------------------------------------

    def assign(self, x: Floats) -> Ints:
        """[N, D] -> [N] the nearest list of each vector (FAISS's flat search, as the IVF quantizer)."""
        if len(x) == 0:
            return np.zeros(0, dtype=np.int64)
        quantizer = faiss.IndexFlatIP(self.dim)
        quantizer.add(self._centroids)
        _, nearest = quantizer.search(np.ascontiguousarray(x, dtype=np.float32), 1)  # [N, 1]
        return nearest[:, 0].astype(np.int64)

    def add(self, x: Floats | None, ids: Ints, clusters: Ints) -> None:
        """Chunks ids [N] into lists [N] (their vectors, when given, are not kept)."""
        ids, clusters = np.asarray(ids, dtype=np.int64), np.asarray(clusters, dtype=np.int64)
        if ids.shape != clusters.shape:
            raise ValueError(f"shape mismatch: ids {ids.shape}, clusters {clusters.shape}")
        if ids.size:
            held_ids, held_lists, _ = self._view
            all_ids = np.concatenate([held_ids, ids])
            order = np.argsort(all_ids, kind="stable")
            self._set(all_ids[order], np.concatenate([held_lists, clusters])[order])

    def remove(self, ids: Iterable[int]) -> int:
        gone = np.fromiter(ids, dtype=np.int64)
        if gone.size == 0:
            return 0
        held_ids, held_lists, _ = self._view
        keep = ~np.isin(held_ids, gone)
        removed = int((~keep).sum())
        if removed:
            self._set(held_ids[keep], held_lists[keep])
        return removed
