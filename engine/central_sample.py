"""The central sample: a few percent of the store's chunks, their vectors and BM25 postings, held
where questions are routed, so the route is decided without asking the expert shards.

Selective search's central sample index (Kulkarni & Callan, Rank-S): the gate's vote (its small
probe of the question's nearest chunks and BM25's best, engine.router) and the route check's
witnesses (the best chunk outside the expert, BM25's best chunk: engine.route_check) read the
sample instead of the whole index. A confident question then makes one search, on its expert's
lists (over shards: one call to one shard), and the fallback one search of everything.

Which chunks are sampled is a function of the chunk id alone (`sampled`), the same in every
process and build; a store of `SAMPLE_FLOOR` chunks or fewer is sampled whole. The lists are the
index's now (a sampled chunk moved by a recluster votes for its new list; a deleted one, list -1,
not at all); the vectors and postings are those of the last BM25 build (app.serving.lexical),
so a chunk added since waits for the next build to be sampled.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from engine.lexical import QueryWeights, TermStats
from engine.postings import Postings
from index import SearchIndex
from index.store import Ask, IdSet

Floats = npt.NDArray[np.float32]
Ints = npt.NDArray[np.int64]

SAMPLE_FLOOR = 2000  # chunks: a store this small is sampled whole (2,000 x 384 float32: 3 MB)
# The share a server over expert shards samples unless told (MOERAG_ROUTING_SAMPLE); one process
# reads its whole index (docs/decisions/central-sample.md: on FAQ dev the sample costs routes).
SHARDED_SHARE = 0.05
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing's multiplier: ids spread over [0, 2^64)


def sample_share(chunks: int, share: float) -> float:
    """The share of `chunks` to sample for a wanted `share` (0: no sample): at least `SAMPLE_FLOOR`."""
    if share <= 0 or chunks <= 0:
        return 0.0
    return min(1.0, max(share, SAMPLE_FLOOR / chunks))


def sampled(ids: Ints, share: float) -> npt.NDArray[np.bool_]:
    """[N] whether each chunk id is in a sample of `share` (by a hash of the id: the same everywhere)."""
    if share >= 1.0:
        return np.ones(len(ids), dtype=bool)
    with np.errstate(over="ignore"):
        h = np.asarray(ids, dtype=np.int64).astype(np.uint64) * _GOLDEN  # [N] wraps mod 2^64
    return (h >> np.uint64(11)).astype(np.float64) < share * float(1 << 53)


@dataclass(frozen=True)
class CentralSample:
    """The sampled chunks: ids [S] ascending, their vectors [S, D] (unit length, as the index's)
    and their BM25 postings, scored with the whole store's statistics (`stats`)."""

    ids: Ints
    vectors: Floats
    postings: Postings
    stats: TermStats
    share: float  # the share of the store sampled when built

    def __len__(self) -> int:
        return len(self.ids)

    def over(self, index: SearchIndex) -> SampleIndex:
        """The sample as an index, its lists as `index` says now."""
        return SampleIndex(self, index)

    def terms(self, question: str) -> SampleTerms | None:
        """The question's BM25 over the sample (None: no term any chunk has)."""
        w = self.stats.weights(question)
        return SampleTerms(self, w) if w is not None else None


@dataclass
class SampleTerms:
    """One question's BM25 over the sample: its best sampled chunks (engine.lexical.BestChunks)."""

    sample: CentralSample
    w: QueryWeights
    _scores: Floats | None = field(default=None, repr=False)

    def search(self, k: int) -> list[tuple[int, float]]:
        """The k best sampled chunks (id, score), best first, ties to the lower id; only chunks sharing a term."""
        if self._scores is None:
            self._scores = self.sample.postings.scores(self.w)  # [S]
        scores, ids = self._scores, self.sample.postings.ids
        hit = np.flatnonzero(scores > 0)  # [H]
        top = hit[np.lexsort((ids[hit], -scores[hit]))[:k]]
        return [(int(ids[i]), float(scores[i])) for i in top]


class SampleIndex:
    """The read API of `SearchIndex` over the sample: searches scan the sampled vectors (exact
    inner product), everything about lists (centroids, sizes, nearest lists, a chunk's list)
    is the whole index's. `scan_size` counts the sampled vectors a search reads."""

    def __init__(self, sample: CentralSample, index: SearchIndex) -> None:
        self.sample, self.index = sample, index
        # The index's version and write count when this view was made (a serving state makes one);
        # the sampled chunks' lists are read from the index itself, as it is at each search.
        self.version, self.writes = index.version, index.writes
        self._lists: tuple[tuple[str, int], Ints] | None = None
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        return int(self.sample.vectors.shape[1]) if len(self.sample) else int(self.index.centroids().shape[1])

    @property
    def nlist(self) -> int:
        return self.index.nlist

    @property
    def ntotal(self) -> int:
        return len(self.sample)

    def centroids(self) -> Floats:
        return self.index.centroids()

    def list_sizes(self) -> Ints:
        return self.index.list_sizes()

    def probe_budget(self, wanted: int) -> int:
        return self.index.probe_budget(wanted)

    def nearest_lists(self, q: Floats, clusters: Iterable[int], nprobe: int) -> Ints:
        return self.index.nearest_lists(q, clusters, nprobe)

    def clusters_of(self, ids: Ints) -> Ints:
        return self.index.clusters_of(ids)

    def sample_lists(self) -> Ints:
        """[S] each sampled chunk's list in the index now (-1: no longer in it), read once per index write."""
        key = (self.index.version, self.index.writes)
        with self._lock:
            if self._lists is None or self._lists[0] != key:
                self._lists = (key, self.index.clusters_of(self.sample.ids))
            return self._lists[1]

    def _rows_in(self, clusters: Iterable[int] | None) -> Ints:
        lists = self.sample_lists()  # [S]
        if clusters is None:
            return np.flatnonzero(lists >= 0)
        wanted = np.fromiter(clusters, dtype=np.int64)
        return np.flatnonzero(np.isin(lists, wanted[wanted >= 0]))

    def scan_size(self, clusters: Iterable[int] | None = None) -> tuple[int, int]:
        lists = self.nlist if clusters is None else len({int(c) for c in clusters if 0 <= c < self.nlist})
        return lists, len(self._rows_in(clusters))

    def search(
        self, q: Floats, k: int, clusters: Iterable[int] | None = None, within: IdSet | None = None
    ) -> tuple[Floats, Ints]:
        """q [Q, D] -> (scores [Q, k], ids [Q, k]) over the sampled vectors in `clusters`' lists
        (None: all; only the ids `within` holds, when given), best first, ties to the lower id;
        missing slots -inf / -1, as FAISS fills them."""
        q = np.ascontiguousarray(q, dtype=np.float32)
        rows = self._rows_in(None if clusters is None else list(clusters))  # [R]
        if within is not None:
            rows = rows[within.contains(self.sample.ids[rows])]
        return _top(q @ self.sample.vectors[rows].T, self.sample.ids[rows], k)  # [Q, R] -> [Q, k]

    def search_each(self, q: Floats, asks: Sequence[Ask], within: IdSet | None = None) -> list[tuple[Floats, Ints]]:
        return [self.search(q, k, clusters, within) for k, clusters in asks]

    def search_nearest(self, q: Floats, k: int, nprobe: int) -> tuple[Floats, Ints, int]:
        """Each row of q [Q, D] over its own `nprobe` nearest lists: (scores [Q, k], ids [Q, k],
        sampled vectors scanned)."""
        q = np.ascontiguousarray(q, dtype=np.float32)
        every = np.arange(self.nlist, dtype=np.int64)
        found, scanned = [], 0
        for row in q:
            near = self.nearest_lists(row, every, max(1, min(nprobe, self.nlist)))
            rows = self._rows_in(near.tolist())
            scanned += len(rows)
            found.append(_top(row[None, :] @ self.sample.vectors[rows].T, self.sample.ids[rows], k))
        return np.vstack([f[0] for f in found]), np.vstack([f[1] for f in found]), scanned


def _top(scores: Floats, ids: Ints, k: int) -> tuple[Floats, Ints]:
    """scores [Q, R] of chunks ids [R] -> the best k (scores [Q, k], ids [Q, k]), ties to the lower id."""
    nq = scores.shape[0]
    out_s = np.full((nq, k), -np.inf, dtype=np.float32)
    out_i = np.full((nq, k), -1, dtype=np.int64)
    for r in range(nq):
        order = np.lexsort((ids, -scores[r]))[:k]
        out_s[r, : len(order)], out_i[r, : len(order)] = scores[r, order], ids[order]
    return out_s, out_i


def build_sample(ids: Ints, vectors: Floats, texts: Sequence[str], stats: TermStats, share: float) -> CentralSample:
    """The sample of the chunks `sampled` chose (ids ascending [S], their vectors [S, D] and BM25
    texts), with `stats` the whole store's BM25 statistics."""
    keep = np.asarray(ids, dtype=np.int64)
    return CentralSample(
        keep,
        np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(keep), -1),
        Postings(keep.tolist(), list(texts)),
        stats,
        share,
    )
