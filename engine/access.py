"""What a scoped caller may read, as the ask flow enforces it inside the searches.

A scoped API token (app.services.tokens) resolves, in one serving state, to an `Allowed`: the
chunk ids it may read and the experts the gate may route it to. The searches take it before
their top k, not after: FAISS scans only those ids (index.store.IdSet), BM25 scores only
their rows (`rows_mask`), so a narrow scope still gets k results when it holds them, and nothing outside
it is ever a candidate. The route names only experts in the scope.
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
    """ids: the chunk ids [A] the caller may read, ascending; experts: those it may be routed to;
    key: names the scope (caches keep one answer a scope); documents: those with a chunk in it."""

    ids: Ints
    experts: frozenset[int]
    key: str
    documents: Mapping[int, int] = field(default_factory=dict)  # document id -> its chunks in the scope
    _masks: weakref.WeakKeyDictionary[Any, npt.NDArray[np.bool_]] = field(
        default_factory=weakref.WeakKeyDictionary, repr=False
    )
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _lists: dict[tuple[str, int], list[int]] = field(default_factory=dict, repr=False)  # one entry: the latest

    def contains(self, ids: Ints) -> npt.NDArray[np.bool_]:
        """[n] whether each chunk id may be read."""
        return self.id_set.contains(ids)

    @cached_property
    def id_set(self) -> IdSet:
        """The ids as the index's searches take them (their FAISS bitmap built once a scope)."""
        return IdSet(self.ids)

    def lists_in(self, index: SearchIndex) -> list[int]:
        """The lists of `index` that hold any of the chunks (a scoped fallback scans those only),
        read once per index version and write count."""
        key = (index.version, index.writes)
        with self._lock:
            if key in self._lists:
                return self._lists[key]
        found = [int(c) for c in np.unique(index.clusters_of(self.ids)) if c >= 0]
        with self._lock:
            self._lists.clear()
            self._lists[key] = found
        return found

    def rows_mask(self, holder: Any, row_ids: Ints) -> npt.NDArray[np.bool_]:
        """[N] bool over `holder`'s rows (their chunk ids `row_ids`): those that may be read,
        computed once per holder (a BM25 index, a sample)."""
        with self._lock:
            mask = self._masks.get(holder)
            if mask is None:
                mask = self.contains(row_ids)
                self._masks[holder] = mask
            return mask
