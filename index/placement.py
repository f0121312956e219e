"""Which list each vector goes to, when lists are grouped (an expert owns a group of lists).

Plain IVF puts a vector in its nearest list. When lists are grouped, that scatters one
document over several groups: a FAQ page whose answers each sit near some other topic ends
up partly outside its expert, where a search scoped to that expert cannot reach it. Placement
by owner keeps an owner's vectors (a document's chunks) in one group:

1. each vector votes for the group of its nearest list (-1: a list no group holds);
2. the owner's group is the one with most votes (ties: the larger summed similarity);
3. each vector goes to the nearest list *of that group* (-1, the lists no expert owns, is a
   group like the others: a document that belongs to no expert stays out of every scope).

Small free functions over numpy arrays, batched so 1M x 1000 lists never builds a full [N, C]
similarity matrix.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float32]
Ints = npt.NDArray[np.int64]

_BATCH = 16_384


def _majority(owners: Ints, groups: Ints, tiebreak: Floats | None = None) -> tuple[Ints, Ints, npt.NDArray[np.bool_]]:
    """Per (owner, group) pair of the rows: is it the owner's majority group?

    -> (pairs [U, 2] sorted by owner, row -> pair [N], majority [U] bool: one per owner). Ties
    go to the larger summed `tiebreak` [N], then to the smaller group id.
    """
    keys = np.stack([owners, groups], axis=1)  # [N, 2]
    pairs, inverse, counts = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    tie = np.zeros(len(pairs)) if tiebreak is None else np.bincount(inverse, weights=tiebreak, minlength=len(pairs))
    order = np.lexsort((-tie, -counts, pairs[:, 0]))  # by owner, then most rows, then the tie-break
    first = np.ones(len(order), dtype=bool)
    first[1:] = pairs[order[1:], 0] != pairs[order[:-1], 0]
    majority = np.zeros(len(pairs), dtype=bool)
    majority[order[first]] = True
    return pairs, inverse, majority


def owner_groups(x: Floats, owners: Ints, centroids: Floats, groups: Ints) -> dict[int, int]:
    """owner id -> its group (-1 = none): the majority group of its vectors' nearest lists.

    x [N, D] unit vectors, owners [N], centroids [C, D], groups [C] (-1 = list in no group).
    """
    pairs = _voted(x, owners, centroids, groups)
    return {int(o): int(g) for o, g in pairs}


def _voted(x: Floats, owners: Ints, centroids: Floats, groups: Ints) -> Ints:
    """[O, 2] (owner, its group) sorted by owner: each vector votes with its nearest list."""
    nearest, best = _nearest(x, centroids)  # [N], [N]
    pairs, _, majority = _majority(owners, np.asarray(groups, dtype=np.int64)[nearest], best.astype(np.float64))
    return pairs[majority]


def place(
    x: Floats,
    owners: Ints,
    centroids: Floats,
    groups: Ints,
    pinned: dict[int, int] | None = None,
    reserved: Collection[int] = (),
) -> Ints:
    """[N] list of each vector: the nearest list within its owner's group (see the module doc).

    pinned: owner -> the group it must go to, whatever the vote (an expert defined by its
    documents; a pinned group that holds no list is ignored); reserved: groups only their pinned
    owners go to (the others vote among the rest of the lists, while there are any).
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    if len(x) == 0:
        return np.zeros(0, dtype=np.int64)
    groups = np.asarray(groups, dtype=np.int64)
    owners = np.asarray(owners, dtype=np.int64)
    open_lists = ~np.isin(groups, list(reserved))  # [C]
    if not open_lists.any():
        open_lists[:] = True
    chosen = _voted(x, owners, centroids[open_lists], groups[open_lists])  # [O, 2] sorted by owner
    target = chosen[np.searchsorted(chosen[:, 0], owners), 1]  # [N] group per vector
    held = set(groups.tolist())
    if pinned := {o: g for o, g in (pinned or {}).items() if g in held}:
        forced = np.fromiter((pinned.get(int(o), -2) for o in owners), dtype=np.int64, count=len(owners))
        target = np.where(forced != -2, forced, target)  # -2: not pinned (-1 is a group)
    out = np.empty(len(x), dtype=np.int64)
    for g in np.unique(target):
        rows = np.flatnonzero(target == g)
        lists = np.flatnonzero(groups == g)  # -1 is a group too: the lists no expert owns
        local, _ = _nearest(x[rows], centroids[lists])
        out[rows] = lists[local]
    return out


def held_groups(x: Floats, owners: Ints, clusters: Ints, centroids: Floats, groups: Ints) -> dict[int, int]:
    """owner id -> the group holding most of its vectors where they are now (x [N, D] in lists
    clusters [N]; centroids [C, D]; groups [C]; -1 is a group, the lists no expert owns). Ties go
    to the larger summed similarity to the lists, as the vote's do (`owner_groups`)."""
    clusters = np.asarray(clusters, dtype=np.int64)
    similarity = np.einsum(
        "nd,nd->n", np.asarray(x, dtype=np.float32), np.asarray(centroids, dtype=np.float32)[clusters]
    )
    owners, groups = np.asarray(owners, dtype=np.int64), np.asarray(groups, dtype=np.int64)
    pairs, _, majority = _majority(owners, groups[clusters], similarity.astype(np.float64))
    return {int(o): int(g) for o, g in pairs[majority]}


def outside(owners: Ints, clusters: Ints, groups: Ints) -> npt.NDArray[np.bool_]:
    """[N] True for a vector outside its owner's majority group (what a scoped search cannot reach)."""
    _, inverse, majority = _majority(np.asarray(owners, dtype=np.int64), np.asarray(groups, dtype=np.int64)[clusters])
    return ~majority[inverse]


def leakage(owners: Ints, clusters: Ints, groups: Ints) -> float:
    """Share of vectors outside their owner's majority group."""
    return float(outside(owners, clusters, groups).mean()) if len(owners) else 0.0


def _nearest(x: Floats, centroids: Floats) -> tuple[Ints, Floats]:
    """([N] nearest row of centroids, [N] its inner product), in batches."""
    idx = np.empty(len(x), dtype=np.int64)
    best = np.empty(len(x), dtype=np.float32)
    c = np.ascontiguousarray(centroids, dtype=np.float32)
    for start in range(0, len(x), _BATCH):
        sims = x[start : start + _BATCH] @ c.T  # [B, C]
        idx[start : start + _BATCH] = sims.argmax(axis=1)
        best[start : start + _BATCH] = sims.max(axis=1)
    return idx, best
