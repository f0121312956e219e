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

A document's fit is the other half, for topics that sit beside a known one (SQLite's pages in
PostgreSQL's lists fit that centroid about as well as its own members): the median over its
chunks of the cosine to the nearest chunk of *another* document among the content the experts
were fitted on. Measured leave-one-document-out on that content, it has a distribution per
expert; a document stored later whose fit lies below its expert's low tail
(`DOCUMENT_FLOOR_QUANTILE`) is a new topic (docs/decisions/open-set-routing.md).

Small free functions over numpy arrays, as `index.placement`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from index.store import ClusteredIndex

Floats = npt.NDArray[np.float32]
Ints = npt.NDArray[np.int64]

FLOOR_QUANTILE = 0.02  # a list's floor is at most this tail of the fits over all lists
# ... and at most this cosine: a chunk this close to a list's centroid is related content however
# tight the list (near-duplicate pages make lists whose lowest member sits at 0.9 and more).
FLOOR_CAP = 0.5
# A document is a new topic below this tail of its expert's fitted documents' fits: by
# construction about this share of new documents on a known topic are flagged too.
DOCUMENT_FLOOR_QUANTILE = 0.1
EXPERT_MIN_DOCUMENTS = 10  # an expert with fewer fitted documents takes the floor over all of them
NEIGHBOUR_LISTS = 16  # lists probed for a chunk's nearest neighbours
NEIGHBOURS = 16  # neighbours read per chunk, leave-one-document-out (its own chunks skipped)


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


def _medians(scores: Floats, documents: Ints) -> dict[int, float]:
    """[N] per-chunk scores of documents [N] -> {document: the median of its chunks' scores}."""
    order = np.argsort(documents, kind="stable")
    docs, starts = np.unique(np.asarray(documents)[order], return_index=True)
    return {int(d): float(np.median(part)) for d, part in zip(docs, np.split(scores[order], starts[1:]), strict=True)}


def document_fits_within(index: ClusteredIndex, x: Floats, ids: Ints, documents: Ints) -> dict[int, float]:
    """Leave-one-document-out over chunks ids [N] of documents [N] with vectors x [N, D], all in
    `index` and all it holds: {document: median over its chunks of the cosine to the nearest chunk
    of another document}. A chunk whose `NEIGHBOURS` nearest are all its own document's counts as
    1.0 (a dense document fits)."""
    if len(x) == 0:
        return {}
    scores, near = index.neighbours(x, NEIGHBOURS, NEIGHBOUR_LISTS)  # [N, K]
    order = np.argsort(ids)
    sorted_ids, sorted_docs = np.asarray(ids)[order], np.asarray(documents)[order]
    at = np.clip(np.searchsorted(sorted_ids, near), 0, len(sorted_ids) - 1)  # [N, K]
    known = (near >= 0) & (sorted_ids[at] == near)
    other = known & (sorted_docs[at] != np.asarray(documents)[:, None])  # [N, K]
    first = np.argmax(other, axis=1)  # [N]: scores are sorted, the first other document is the nearest
    best = np.where(other.any(axis=1), scores[np.arange(len(x)), first], 1.0).astype(np.float32)  # [N]
    return _medians(best, documents)


def document_fit(index: ClusteredIndex, x: Floats, through: int) -> float | None:
    """One new document's vectors x [N, D] -> its fit against the chunks with id <= `through` (the
    content the experts were fitted on; its own chunks come later); None: nothing to compare."""
    if len(x) == 0:
        return None
    scores, ids = index.neighbours(x, 1, NEIGHBOUR_LISTS, through=through)  # [N, 1]
    found = ids[:, 0] >= 0
    return float(np.median(scores[found, 0])) if found.any() else None


def document_floors(
    fit: dict[int, float], expert_of: dict[int, int], quantile: float = DOCUMENT_FLOOR_QUANTILE
) -> dict[int, float]:
    """Fitted documents' fits and experts -> {expert: floor}: the `quantile` tail of its documents'
    fits, or of all of them for an expert with fewer than `EXPERT_MIN_DOCUMENTS`."""
    if not fit:
        return {}
    overall = float(np.quantile(list(fit.values()), quantile))
    by_expert: dict[int, list[float]] = {}
    for d, f in fit.items():
        if d in expert_of:
            by_expert.setdefault(expert_of[d], []).append(f)
    return {
        e: float(np.quantile(v, quantile)) if len(v) >= EXPERT_MIN_DOCUMENTS else overall for e, v in by_expert.items()
    }
