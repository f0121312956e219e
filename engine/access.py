"""What a scoped caller may read, as the ask flow enforces it inside the searches.

A scoped API token (app.services.tokens) resolves, in one serving state, to an `Allowed`: the
chunk ids it may read and the experts the gate may route it to. The searches take it before
their top k, not after: FAISS scans only those ids (index.store.IdSet), BM25 scores only
their rows (`rows_mask`), so a narrow scope still gets k results when it holds them, and nothing outside
it is ever a candidate. The route names only experts in the scope; an expert the scope holds only
part of may still be routed to (its part searched), unnamed.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from index.store import IdSet, SearchIndex

Ints = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class Allowed:
    """ids: the chunk ids [A] the caller may read, ascending; experts: those it may see named (and
    be routed to); key: names the scope (caches keep one answer a scope); documents: those with a
    chunk in it; partly: the other experts holding some of its chunks, which a route may search
    within the scope without naming them."""

    ids: Ints
    experts: frozenset[int]
    key: str
    documents: Mapping[int, int] = field(default_factory=dict)  # document id -> its chunks in the scope
    partly: Mapping[int, int] = field(default_factory=dict)  # expert id -> its chunks in the scope
    _masks: weakref.WeakKeyDictionary[Any, npt.NDArray[np.bool_]] = field(
        default_factory=weakref.WeakKeyDictionary, repr=False
    )
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # One entry, the latest index state: the lists holding the chunks and the chunks in each list.
    _lists: dict[tuple[str, int], tuple[list[int], Ints]] = field(default_factory=dict, repr=False)

    def contains(self, ids: Ints) -> npt.NDArray[np.bool_]:
        """[n] whether each chunk id may be read."""
        return self.id_set.contains(ids)

    @cached_property
    def id_set(self) -> IdSet:
        """The ids as the index's searches take them (their FAISS bitmap built once a scope)."""
        return IdSet(self.ids)

    def lists_in(self, index: SearchIndex) -> list[int]:
        """The lists of `index` that hold any of the chunks (a scoped fallback scans those only)."""
        return self._placed(index)[0]

    def scan_size(self, index: SearchIndex, clusters: list[int] | None) -> tuple[int, int]:
        """(lists, vectors) of the scope a search over `clusters` of `index` reads (None: every
        list: those holding any of the chunks): what a scoped route reports scanning, nothing
        counted outside the scope."""
        holding, per_list = self._placed(index)  # [nlist]
        if clusters is None:
            return len(holding), int(per_list.sum())
        valid = [c for c in clusters if 0 <= c < len(per_list)]
        return len(valid), int(per_list[valid].sum())

    def place(self, index: SearchIndex, per_list: Ints) -> tuple[list[int], Ints]:
        """Take [nlist] the chunks in each list of `index` as counted when the reach was made
        (app.services.tokens), so no question reads their lists again -> what `_placed` keeps."""
        found = ([int(c) for c in np.flatnonzero(per_list)], per_list)
        with self._lock:
            self._lists.clear()
            self._lists[(index.version, index.writes)] = found
        return found

    def _placed(self, index: SearchIndex) -> tuple[list[int], Ints]:
        """(the lists holding any of the chunks, [nlist] the chunks in each), read once per index
        version and write count (or taken from the reach's own count: `place`)."""
        with self._lock:
            found = self._lists.get((index.version, index.writes))
        if found is not None:
            return found
        lists = index.clusters_of(self.ids)  # [A] -1: not in the index
        return self.place(index, np.bincount(lists[lists >= 0], minlength=index.nlist).astype(np.int64))

    def rows_mask(self, holder: Any, row_ids: Ints) -> npt.NDArray[np.bool_]:
        """[N] bool over `holder`'s rows (their chunk ids `row_ids`): those that may be read,
        computed once per holder (a BM25 index, a sample)."""
        with self._lock:
            mask = self._masks.get(holder)
            if mask is None:
                mask = self.contains(row_ids)
                self._masks[holder] = mask
            return mask


def scan_size(index: SearchIndex, allowed: Allowed | None, lists: list[int] | None) -> tuple[int, int]:
    """(lists, vectors) a search over `lists` of `index` reads (None: every list), as a route or a
    search reports it: of a scoped caller's chunks only, nothing counted outside its scope."""
    return allowed.scan_size(index, lists) if allowed is not None else index.scan_size(lists)
