"""A FAISS IVF index on inner product whose inverted lists are clusters.

- chunk id == FAISS id; every vector lives in exactly one list (its cluster);
- search is global (every list: exactly a flat search) or scoped to a set of lists
  (`search_preassigned`), so an expert that owns some clusters scans only those;
- persistence is atomic (temp file, fsync, rename, fsync of the directory);
- vectors are stored whole (`flat`: 4 bytes a dimension, exact scores) or as 8-bit codes (`sq8`:
  one byte a dimension, FAISS's scalar quantizer over the fixed range ±SQ8_SPAN/sqrt(d), which
  holds every component of a unit vector the model makes; no training, so every process that
  builds the index from the same rows scores the same).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import faiss
import numpy as np
import numpy.typing as npt

from index.locks import ReadWrite

Floats = npt.NDArray[np.float32]
Ints = npt.NDArray[np.int64]
CODECS = ("flat", "sq8")
SQ8_SPAN = 8.0  # sq8 codes components in [-8/sqrt(d), 8/sqrt(d)]: ±0.41 at d=384, where the largest seen is 0.30


def _sq8(quantizer: Any, d: int, c: int) -> Any:
    """An IVF of 8-bit codes over a fixed range (trained without data: [vmin] * d + [vdiff] * d)."""
    ivf = faiss.IndexIVFScalarQuantizer(
        quantizer, d, c, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT, False
    )
    span = min(1.0, SQ8_SPAN / np.sqrt(d))
    trained = np.concatenate([np.full(d, -span), np.full(d, 2 * span)]).astype(np.float32)
    ivf.sq.trained.resize(2 * d)
    faiss.copy_array_to_vector(trained, ivf.sq.trained)
    return ivf


Ask = tuple[int, Iterable[int] | None]  # (k, the lists to scan; None: every list)


class IdSet:
    """The chunk ids a search may return (a scoped caller's: engine.access): `ids` [A] ascending,
    and the bitmap FAISS tests each scanned id against (bit i of byte i >> 3), built once: a bit
    test a vector, where a batch selector would build a hash set every search."""

    def __init__(self, ids: Ints) -> None:
        self.ids = np.ascontiguousarray(ids, dtype=np.int64)
        bits = np.zeros(int(self.ids.max()) + 1 if len(self.ids) else 8, dtype=bool)
        bits[self.ids] = True
        self.bitmap = np.packbits(bits, bitorder="little")  # [ceil(max id / 8)] uint8

    def contains(self, ids: Ints) -> npt.NDArray[np.bool_]:
        """[n] whether each id is in the set: its bit (an id past the bitmap, or negative, is not)."""
        ids = np.asarray(ids, dtype=np.int64)
        inside = (ids >= 0) & (ids < 8 * len(self.bitmap))
        out = np.zeros(ids.shape, dtype=bool)
        at = ids[inside]
        out[inside] = (self.bitmap[at >> 3] >> (at & 7)) & 1 == 1
        return out

    def selector(self) -> Any:
        """A FAISS selector over the bitmap (it reads this object's array: keep both alive for the search)."""
        return faiss.IDSelectorBitmap(len(self.bitmap), faiss.swig_ptr(self.bitmap))


class SearchIndex(Protocol):
    """What the question path reads of an index: `ClusteredIndex`, or `index.shards.ShardedIndex`
    whose vectors live in shards. Shapes as in `ClusteredIndex`."""

    version: str
    writes: int

    @property
    def nlist(self) -> int: ...
    @property
    def ntotal(self) -> int: ...
    def centroids(self) -> Floats: ...
    def list_sizes(self) -> Ints: ...
    def scan_size(self, clusters: Iterable[int] | None = None) -> tuple[int, int]: ...
    def probe_budget(self, wanted: int) -> int: ...
    def nearest_lists(self, q: Floats, clusters: Iterable[int], nprobe: int) -> Ints: ...
    def clusters_of(self, ids: Ints) -> Ints: ...
    def search(
        self, q: Floats, k: int, clusters: Iterable[int] | None = None, within: IdSet | None = None
    ) -> tuple[Floats, Ints]: ...
    def search_each(self, q: Floats, asks: Sequence[Ask], within: IdSet | None = None) -> list[tuple[Floats, Ints]]: ...
    def search_nearest(self, q: Floats, k: int, nprobe: int) -> tuple[Floats, Ints, int]: ...


class IndexCorrupt(RuntimeError):
    """The file on disk is not a readable index of the expected kind."""


class ClusteredIndex:
    def __init__(self, ivf: faiss.IndexIVFFlat | faiss.IndexIVFScalarQuantizer, version: str) -> None:
        # Any: faiss's generated stubs describe the C++ signatures, not the numpy wrappers.
        self._ivf: Any = ivf
        # Probe every list by default: a global search is then exact, and scoped searches pass
        # their lists padded with -1 to this width, so no per-call state is mutated.
        self._ivf.nprobe = ivf.nlist
        self._ivf.parallel_mode = 0
        self.version = version
        self._lock = ReadWrite()  # searches and snapshots read together; add and remove write alone
        self._centroids: Floats | None = None  # the quantizer never changes after construction
        self.writes = 0  # bumped by every add/remove: a key for what callers derive from the lists
        self._where: tuple[int, Ints, Ints] | None = None  # (writes, ids sorted, their lists)
        self._sizes: tuple[int, Ints] | None = None  # (writes, vectors per list)

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def create(cls, centroids: Floats, version: str, codec: str = "flat") -> ClusteredIndex:
        """An empty index with the given [C, D] centroids as its lists, storing vectors as `codec`."""
        if codec not in CODECS:
            raise ValueError(f"unknown codec {codec!r}: one of {CODECS}")
        c, d = centroids.shape
        quantizer: Any = faiss.IndexFlatIP(d)
        quantizer.add(np.ascontiguousarray(centroids, dtype=np.float32))
        ivf = (
            _sq8(quantizer, d, c) if codec == "sq8" else faiss.IndexIVFFlat(quantizer, d, c, faiss.METRIC_INNER_PRODUCT)
        )
        ivf.own_fields = True
        quantizer.this.disown()
        ivf.is_trained = True
        return cls(ivf, version)

    @classmethod
    def single(cls, dim: int, version: str, codec: str = "flat") -> ClusteredIndex:
        """One list holding everything: the layout of a corpus too small to cluster."""
        return cls.create(np.zeros((1, dim), dtype=np.float32), version, codec)

    # ---- facts ------------------------------------------------------------------------------

    @property
    def dim(self) -> int:
        return int(self._ivf.d)

    @property
    def nlist(self) -> int:
        return int(self._ivf.nlist)

    @property
    def ntotal(self) -> int:
        return int(self._ivf.ntotal)

    @property
    def codec(self) -> str:
        """How vectors are stored: "flat" (float32) or "sq8" (8-bit codes)."""
        return "sq8" if isinstance(self._ivf, faiss.IndexIVFScalarQuantizer) else "flat"

    def centroids(self) -> Floats:
        """[C, D] (a shared read-only array)"""
        if self._centroids is None:
            c = np.asarray(self._ivf.quantizer.reconstruct_n(0, self.nlist), dtype=np.float32)
            c.setflags(write=False)
            self._centroids = c
        return self._centroids

    def _valid_lists(self, clusters: Iterable[int]) -> Ints:
        """The distinct lists of `clusters` that exist in this index, ascending."""
        lists = np.fromiter(clusters, dtype=np.int64)
        if lists.size > 1 and not (lists[1:] > lists[:-1]).all():  # the usual scope is already distinct, ascending
            lists = np.unique(lists)
        return lists[(lists >= 0) & (lists < self.nlist)]

    def scan_size(self, clusters: Iterable[int] | None = None) -> tuple[int, int]:
        """(lists, vectors) a search over `clusters` scans (None: every list), from the cached `list_sizes`."""
        if clusters is None:
            return self.nlist, self.ntotal
        lists = self._valid_lists(clusters)
        return len(lists), int(self.list_sizes()[lists].sum())

    def probe_budget(self, wanted: int) -> int:
        """Lists a side probe may scan (the gate's vote, the route's check): at most 1/8 of them."""
        return max(0, min(wanted, self.nlist // 8))

    def nearest_lists(self, q: Floats, clusters: Iterable[int], nprobe: int) -> Ints:
        """The `nprobe` of `clusters` whose centroids are nearest q [D] (IVF probing inside a scope)."""
        return nearest_of(self.centroids(), q, self._valid_lists(clusters), nprobe)

    def list_sizes(self) -> Ints:
        """[C] vectors per cluster (read-only; counted again after a write, as `clusters_of` is)."""
        cached = self._sizes
        if cached is None or cached[0] != self.writes:
            writes = self.writes
            with self._lock.read():
                invlists = self._ivf.invlists
                sizes = np.array([invlists.list_size(c) for c in range(self.nlist)], dtype=np.int64)
            sizes.setflags(write=False)
            cached = self._sizes = (writes, sizes)
        return cached[1]

    def assignments(self) -> tuple[Ints, Ints]:
        """(ids [N], clusters [N]) of every vector in the index, sorted by id."""
        with self._lock.read():
            invlists = self._ivf.invlists
            ids_parts, cluster_parts = [], []
            for c in range(self.nlist):
                size = invlists.list_size(c)
                if size:
                    ids_parts.append(faiss.rev_swig_ptr(invlists.get_ids(c), size).copy())
                    cluster_parts.append(np.full(size, c, dtype=np.int64))
        if not ids_parts:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        ids, clusters = np.concatenate(ids_parts), np.concatenate(cluster_parts)
        order = np.argsort(ids, kind="stable")
        return ids[order], clusters[order]

    def clusters_of(self, ids: Ints) -> Ints:
        """[N] list holding each id (-1: not in the index), from a sorted copy rebuilt after writes."""
        cached = self._where
        if cached is None or cached[0] != self.writes:
            writes = self.writes
            sorted_ids, lists = self.assignments()
            cached = self._where = (writes, sorted_ids, lists)
        _, sorted_ids, lists = cached
        ids = np.asarray(ids, dtype=np.int64)
        if sorted_ids.size == 0:
            return np.full(ids.shape, -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(sorted_ids, ids), sorted_ids.size - 1)  # [N]
        return np.where(sorted_ids[pos] == ids, lists[pos], -1)

    # ---- writes -----------------------------------------------------------------------------

    def assign(self, x: Floats) -> Ints:
        """[N, D] -> [N] nearest cluster of each vector."""
        if len(x) == 0:
            return np.zeros(0, dtype=np.int64)
        _, nearest = self._ivf.quantizer.search(np.ascontiguousarray(x, dtype=np.float32), 1)  # [N, 1]
        return nearest[:, 0].astype(np.int64)

    def add(self, x: Floats, ids: Ints, clusters: Ints) -> None:
        """Put vectors [N, D] with ids [N] into the given clusters [N]."""
        n = len(ids)
        if n == 0:
            return
        x = np.ascontiguousarray(x, dtype=np.float32)
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        clusters = np.ascontiguousarray(clusters, dtype=np.int64)
        if x.shape != (n, self.dim) or clusters.shape != (n,):
            raise ValueError(f"shape mismatch: x {x.shape}, ids {ids.shape}, clusters {clusters.shape}")
        if n and (clusters.min() < 0 or clusters.max() >= self.nlist):
            raise ValueError(f"cluster out of range 0..{self.nlist - 1}")
        with self._lock.write():
            self._ivf.add_core(n, faiss.swig_ptr(x), faiss.swig_ptr(ids), faiss.swig_ptr(clusters))
            self.writes += 1

    def remove(self, ids: Iterable[int]) -> int:
        arr = np.fromiter(ids, dtype=np.int64)
        if arr.size == 0:
            return 0
        with self._lock.write():
            self.writes += 1
            return int(self._ivf.remove_ids(faiss.IDSelectorBatch(arr.size, faiss.swig_ptr(arr))))

    # ---- search -----------------------------------------------------------------------------

    def search(
        self, q: Floats, k: int, clusters: Iterable[int] | None = None, within: IdSet | None = None
    ) -> tuple[Floats, Ints]:
        """Top-k by inner product. q [Q, D] -> (scores [Q, K], ids [Q, K]); missing slots get id -1.

        clusters=None searches every list (exact); otherwise only the given lists are scanned.
        within: only these chunk ids are candidates (a scoped caller's: engine.access).
        """
        q = np.ascontiguousarray(q, dtype=np.float32)
        if q.ndim != 2 or q.shape[1] != self.dim:
            raise ValueError(f"queries must be [Q, {self.dim}], got {q.shape}")
        if k <= 0:
            raise ValueError("k must be positive")
        if clusters is not None or within is not None:
            lists = self._valid_lists(clusters) if clusters is not None else np.arange(self.nlist, dtype=np.int64)
            return self.search_rows(q, k, [lists] * len(q), within=within)
        with self._lock.read():
            scores, ids = self._ivf.search(q, k)
        return scores, ids

    def search_each(self, q: Floats, asks: Sequence[Ask], within: IdSet | None = None) -> list[tuple[Floats, Ints]]:
        """Several searches of the same q [Q, D], each (k, lists) as `search` takes them: their
        results in order. Here one after the other; over shards (index.shards) sent at once."""
        return [self.search(q, k, lists, within) for k, lists in asks]

    def search_rows(
        self,
        q: Floats,
        k: int,
        lists: Sequence[Iterable[int]],
        through: int | None = None,
        within: IdSet | None = None,
    ) -> tuple[Floats, Ints]:
        """Each row of q [Q, D] over its own lists (`lists[i]` for row i) in one scan, only ids <=
        `through` when given, only the ids `within` holds when given: (scores [Q, K],
        ids [Q, K]); a row with no list to scan gets (-inf, -1) throughout."""
        q = np.ascontiguousarray(q, dtype=np.float32)
        if q.ndim != 2 or q.shape[1] != self.dim or len(lists) != len(q):
            raise ValueError(f"queries must be [Q, {self.dim}] with one list set a row, got {q.shape}, {len(lists)}")
        if k <= 0:
            raise ValueError("k must be positive")
        valid = [self._valid_lists(row) for row in lists]
        probe = np.full((len(q), self.nlist), -1, dtype=np.int64)  # [Q, C], -1 = no list
        for i, v in enumerate(valid):
            probe[i, : v.size] = v
        # FAISS's C call: its Python wrapper takes no search parameters (the id filter).
        scores, ids = np.empty((len(q), k), dtype=np.float32), np.empty((len(q), k), dtype=np.int64)
        near = np.zeros(probe.shape, dtype=np.float32)  # [Q, C] no distances to the lists: unused here
        # Alive for the call: an id bound, the ids a scoped caller may read, or both.
        selector: Any = faiss.IDSelectorRange(0, through + 1) if through is not None else None
        if within is not None:
            allowed = within.selector()
            selector = allowed if selector is None else faiss.IDSelectorAnd(selector, allowed)
        ivf_params: Any = faiss.SearchParametersIVF
        params = ivf_params(sel=selector, nprobe=self.nlist) if selector is not None else None
        ptr = faiss.swig_ptr
        with self._lock.read():
            self._ivf.search_preassigned_c(
                len(q), ptr(q), k, ptr(probe), ptr(near), ptr(scores), ptr(ids), False, params
            )
        scores[[i for i, v in enumerate(valid) if v.size == 0]] = -np.inf  # no list to scan, as `search` says it
        return scores, ids

    def search_nearest(self, q: Floats, k: int, nprobe: int) -> tuple[Floats, Ints, int]:
        """IVF search of each question's own `nprobe` nearest lists (no shared state mutated).

        q [Q, D] -> (scores [Q, K], ids [Q, K], vectors scanned in all); missing slots get id -1.
        """
        q = np.ascontiguousarray(q, dtype=np.float32)
        nq, nprobe = len(q), max(1, min(nprobe, self.nlist))
        with self._lock.read():
            _, nearest = self._ivf.quantizer.search(q, nprobe)  # [Q, P]
            probe = np.full((nq, self.nlist), -1, dtype=np.int64)  # [Q, C], -1 = no list
            probe[:, :nprobe] = nearest
            scores, ids = self._ivf.search_preassigned(q, k, probe, None)
        scanned = int(self.list_sizes()[nearest[nearest >= 0]].sum())
        return scores, ids, scanned

    def neighbours(self, q: Floats, k: int, nprobe: int, through: int | None = None) -> tuple[Floats, Ints]:
        """Each row's k nearest vectors in its own `nprobe` nearest lists, only ids <= `through`
        when given (chunk ids grow: the content stored up to a moment). q [Q, D] -> (scores
        [Q, K], ids [Q, K]); missing slots get id -1."""
        q = np.ascontiguousarray(q, dtype=np.float32)
        selector = faiss.IDSelectorRange(0, through + 1) if through is not None else None  # alive for the call
        ivf_params: Any = faiss.SearchParametersIVF
        params = ivf_params(sel=selector, nprobe=max(1, min(nprobe, self.nlist)))
        with self._lock.read():
            scores, ids = self._ivf.search(q, k, params=params)
        return scores, ids

    def subset(self, lists: Iterable[int], version: str) -> ClusteredIndex:
        """A new index with every centroid of this one (list ids agree) holding only the vectors
        of `lists`, copied code for code (index.shards)."""
        part = ClusteredIndex.create(self.centroids(), version, self.codec)
        src, dst = self._ivf.invlists, part._ivf.invlists
        with self._lock.read():
            for c in self._valid_lists(lists):
                size = src.list_size(int(c))
                if size:
                    dst.add_entries(int(c), size, src.get_ids(int(c)), src.get_codes(int(c)))
                    part._ivf.ntotal += size
        part.writes += 1
        return part

    # ---- persistence -------------------------------------------------------------------------

    def serialized(self) -> memoryview:
        """The index as FAISS writes it, without a copy into `bytes`. FAISS serializes without
        the GIL, under a background read (index.locks), so searches go on meanwhile."""
        with self._lock.read(background=True):
            data: npt.NDArray[np.uint8] = faiss.serialize_index(self._ivf)  # [bytes]
        return data.data

    def to_bytes(self) -> bytes:
        return self.serialized().tobytes()

    @classmethod
    def from_bytes(cls, data: bytes, version: str) -> ClusteredIndex:
        try:
            ivf = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
        except RuntimeError as exc:
            raise IndexCorrupt(f"unreadable index: {exc}") from exc
        # deserialize_index already returns the concrete class; downcasting again would hand
        # ownership to a temporary proxy and free the index under us.
        kinds = (faiss.IndexIVFFlat, faiss.IndexIVFScalarQuantizer)
        if not isinstance(ivf, kinds) or ivf.metric_type != faiss.METRIC_INNER_PRODUCT:
            raise IndexCorrupt(f"expected an inner-product IndexIVFFlat or IVF SQ8, got {type(ivf).__name__}")
        return cls(ivf, version)

    def save(self, path: Path) -> None:
        write_atomic(path, self.serialized())

    @classmethod
    def load(cls, path: Path, version: str) -> ClusteredIndex:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise IndexCorrupt(f"cannot read {path}: {exc}") from exc
        return cls.from_bytes(data, version)


def nearest_of(centroids: Floats, q: Floats, lists: Ints, nprobe: int) -> Ints:
    """The `nprobe` of `lists` (distinct, valid) whose centroids [C, D] are nearest q [D], ascending."""
    if nprobe <= 0 or lists.size <= nprobe:
        return lists
    scores = (centroids @ np.asarray(q, dtype=np.float32))[lists]  # [L]; no copy of their centroids
    return np.sort(lists[np.argpartition(-scores, nprobe - 1)[:nprobe]])


def write_atomic(path: Path, data: bytes | memoryview) -> None:
    """Write-then-rename so a crash leaves either the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
