"""How well a vector fits the list it lives in: the open-set signal of routing and drift.

A chunk's fit is its cosine to its list's centroid. Each list has a floor, set when the lists
are clustered: its lowest member's fit, never above the low tail of the fits over every list
(`FLOOR_QUANTILE`) nor above `FLOOR_CAP`, so a tight list does not reject its own neighbours. No chunk is below
its floor when the lists are made; one that is later lies outside the content the lists were
fitted on: a topic that arrived later and landed in the nearest list only because every vector
lands somewhere.

On the pydoc sample (1,035 chunks, 26 lists) the members' 2% tail is 0.31 and sections on two
topics it never saw (sourdough, Kubernetes networking) fit their nearest list at 0.05-0.24, one
of 24 at 0.35 (docs/decisions/open-set-routing.md).

Small free functions over numpy arrays, as `index.placement`.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float32]
Ints = npt.NDArray[np.int64]

FLOOR_QUANTILE = 0.02  # a list's floor is at most this tail of the fits over all lists
# ... and at most this cosine: a chunk this close to a list's centroid is related content however
# tight the list (near-duplicate pages make lists whose lowest member sits at 0.9 and more).
FLOOR_CAP = 0.5


def fits(x: Floats, centroids: Floats, lists: Ints) -> Floats | None:
    """x [N, D] unit vectors in lists [N] of centroids [C, D] -> [N] cosine to their list's centroid.

    None when the lists have no centroids to speak of (the single all-zero list of a store too
    small to cluster): fit is then unknown, not bad.
    """
    if len(centroids) == 0 or not np.any(centroids):
        return None
    c = centroids[np.asarray(lists, dtype=np.int64)]  # [N, D]
    return np.einsum("nd,nd->n", np.asarray(x, dtype=np.float32), c).astype(np.float32)


def floors(fit: Floats, lists: Ints, nlist: int, quantile: float = FLOOR_QUANTILE) -> Floats:
    """[N] members' fits in lists [N] -> [C] each list's floor: min(its lowest member, the tail over
    all, FLOOR_CAP).

    A list without members takes the tail over all; no members at all gives -inf (all fit).
    """
    if len(fit) == 0:
        return np.full(nlist, -np.inf, dtype=np.float32)
    overall = min(float(np.quantile(fit, quantile)), FLOOR_CAP)
    out = np.full(nlist, overall, dtype=np.float32)  # [C]
    order = np.argsort(lists, kind="stable")
    bounds = np.searchsorted(np.asarray(lists)[order], np.arange(nlist + 1))
    for c in range(nlist):
        members = fit[order[bounds[c] : bounds[c + 1]]]
        if len(members):
            out[c] = min(overall, float(members.min()))
    return out
