"""k-means over stored embeddings (faiss) and the automatic cluster count."""

from __future__ import annotations

import math

import faiss
import numpy as np
import numpy.typing as npt

# The automatic count gives lists of at least this many chunks on average. A small corpus gets
# small lists, so a team's first few dozen documents already split into topics an expert can
# own (28 chunks: 3 lists). sqrt(N) binds from 64 chunks on. Search over the lists stays exact
# for the fallback (every list is probed); FAISS's own advice of 39 training points a centroid
# is about approximate search over millions of vectors, not about telling topics apart.
MIN_LIST_SIZE = 8


def auto_cluster_count(n: int, *, requested: int = 0) -> int:
    """sqrt(N) lists (the usual IVF rule), at most N / MIN_LIST_SIZE; `requested` (> 0) is the
    operator's, bounded by one chunk a list."""
    if requested > 0:  # the operator's choice; k-means still needs a point per list
        return max(1, min(requested, n))
    return max(1, min(round(math.sqrt(n)), n // MIN_LIST_SIZE))


KMEANS_SEED = 20250601  # the default seed (MOERAG_CLUSTER_SEED): the same vectors and seed give the same lists


def kmeans(x: npt.NDArray[np.float32], k: int, *, seed: int = KMEANS_SEED, niter: int = 20) -> npt.NDArray[np.float32]:
    """Spherical k-means: [N, D] normalised vectors -> [C, D] unit centroids (C = k)."""
    n, d = x.shape
    if k <= 1 or n < 2:
        centroid = x.mean(axis=0, keepdims=True) if n else np.zeros((1, d), dtype=np.float32)  # [1, D]
        norm = float(np.linalg.norm(centroid))
        return np.ascontiguousarray(centroid / norm if norm > 0 else centroid, dtype=np.float32)
    # Several restarts (best objective kept) where they are cheap: small corpora fall into poor
    # local minima that merge two obvious topics and split a third.
    nredo = 10 if n * k <= 2_000_000 else 1
    # min_points_per_centroid=1: FAISS uses it only to print "WARNING clustering N points to K
    # centroids: please provide at least ... training points" on stderr, which users took for an
    # error; the automatic count keeps MIN_LIST_SIZE, a count the operator asks for is theirs.
    km = faiss.Kmeans(
        d,
        k,
        niter=niter,
        nredo=nredo,
        seed=seed,
        spherical=True,
        max_points_per_centroid=256,
        min_points_per_centroid=1,
        verbose=False,
    )
    km.train(np.ascontiguousarray(x, dtype=np.float32))
    return np.ascontiguousarray(km.centroids, dtype=np.float32)  # [C, D]
