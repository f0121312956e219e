"""The serving state's follower: one `ServingState` per catalogue version, published by a swap.

`ServingStates.changed` is the catalogue subscriber that runs after the index replica has
applied the change (app.runtime subscribes it last). It builds the next state from the previous
one, reloading only the parts that changed: profiles and mapping from SQL when experts or
clusters changed, the active router when router versions changed, the kernel's expert matrix
when chunks or the mapping changed (GPU deployments only). The work runs in the thread that
applies the catalogue: the follower thread, or a writer's own thread at its commit (read your
own writes), never a question's. A BM25 rebuild (app.serving.lexical) publishes through
`lexical_built`. Publications are serialised by one lock, so a slow build never overwrites a
newer state; readers never lock: `current()` is one reference read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

import numpy as np
import torch
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.clustering.indexing import IndexManager
from app.core.models import Chunk, cluster_owners, stack
from app.store.profiles import load_profiles
from engine.central_sample import CentralSample
from engine.expert_matrix import ExpertMatrix
from engine.lexical import LexicalIndex, TermStats
from engine.router import Router
from engine.serving import ExpertProfile, ServingState
from engine.sharded_lexical import ShardedLexical
from index import ClusteredIndex, SearchIndex
from index.list_map import ListMap
from index.shards import ShardedIndex

log = logging.getLogger(__name__)

_MATRIX_PARTS = frozenset({"documents", "clusters", "experts", "index"})
_PROFILE_PARTS = frozenset({"clusters", "experts", "index"})


class ShardTier(Protocol):
    """Where the index's vectors live when they are spread over expert shards (app.shards.client.RayShards)."""

    def index_over(
        self, index: ClusteredIndex | ListMap, experts: Mapping[int, ExpertProfile], position: int
    ) -> ShardedIndex:
        """The state's index: `index`'s lists over the shards, searched at catalogue version `position` or later."""
        ...

    def lexical_over(self, stats: TermStats, index: ShardedIndex, position: int, summary: bool) -> ShardedLexical:
        """The state's BM25: the shards' postings scored with `stats`, at catalogue version `position`
        or later; `summary`: every shard asked for its best chunks at a question's start."""
        ...

    def overview(self) -> list[dict[str, Any]]:
        """Each shard, for operators: its experts, replicas, lists, vectors, position, searches sent."""
        ...

    def health(self) -> list[dict[str, Any]]:
        """Each shard as this process sees it, without asking it: calls, errors, calls skipped and
        its breaker's state (index.shards.ShardBreakers)."""
        ...


class ServingStates:
    """Builds and publishes the serving state; `current()` is what a question takes at its start."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        indexes: IndexManager,
        load_router: Callable[[], Router | None],
        *,
        kernel_matrix: bool = False,
        matrix_dtype: str = "auto",
        shards: ShardTier | None = None,
        prepare: Callable[[int, Mapping[int, ExpertProfile], SearchIndex], object] | None = None,
    ) -> None:
        """prepare: made ready for each new catalogue version before its state is published, with
        its experts and index (the reach of the scoped tokens in use, app.services.tokens), so
        that no question builds it on its path."""
        self.sessions, self.indexes, self.load_router = sessions, indexes, load_router
        self.prepare = prepare
        self.kernel_matrix = kernel_matrix  # the scoped kernel serves the expert path: keep its matrix
        self.matrix_dtype = matrix_dtype  # how it stores the vectors (MOERAG_MATRIX_DTYPE)
        self._state: ServingState | None = None
        self._serial = 0
        self._lock = threading.Lock()
        self.build_ms = {"last": 0.0, "max": 0.0}  # building a state after a catalogue change (/readyz)
        # Expert shards (app.shards.client.RayShards): the state's index is then the replica's lists
        # spread over the shards, as the shard map says for the state's experts.
        self.shards = shards
        self._lexical: LexicalIndex | None = None  # the BM25 index now (its statistics, over shards)
        self._lexical_version = 0
        self._sample: CentralSample | None = None  # built with BM25 (app.serving.lexical)

    def search_index(self) -> Any:
        """What searches every vector now: this process's replica, else (a server over expert shards)
        the current state's lists searched on the shards, else (before the first state) a one-off
        index from SQL."""
        held = self.indexes.index
        if isinstance(held, ClusteredIndex) or self._state is None:
            return self.indexes.search_index()
        return self._state.index

    def current(self) -> ServingState:
        state = self._state
        assert state is not None, "no serving state published yet"
        return state

    def start(
        self,
        version: int,
        lexical: LexicalIndex | None,
        lexical_version: int,
        sample: CentralSample | None = None,
    ) -> ServingState:
        """The first state: every part read now (the catalogue was opened at `version` or before)."""
        with self._lock:
            experts = load_profiles(self.sessions)
            self._lexical, self._lexical_version, self._sample = lexical, lexical_version, sample
            return self._publish(
                version, experts, self.load_router(), self._matrix(experts) if self.kernel_matrix else None
            )

    def changed(self, version: int, parts: frozenset[str]) -> None:
        """A catalogue subscriber for every part: the next state, with what `parts` changed reread."""
        t0 = time.perf_counter()
        with self._lock:
            old = self.current()
            experts = load_profiles(self.sessions) if parts & _PROFILE_PARTS else old.experts
            router = self.load_router() if "router" in parts else old.router
            matrix = old.matrix
            if self.kernel_matrix and parts & _MATRIX_PARTS:
                matrix = self._matrix(experts, old.matrix)
            held = self.indexes.index
            if self.prepare is not None and isinstance(held, ClusteredIndex):  # scopes: one process
                self.prepare(version, experts, held)
            self._publish(version, experts, router, matrix)
            took = (time.perf_counter() - t0) * 1000
            self.build_ms = {"last": round(took, 3), "max": round(max(took, self.build_ms["max"]), 3)}

    def reshard(self, shards: ShardTier) -> ServingState:
        """The current catalogue version again, over `shards` (a changed shard map)."""
        with self._lock:
            self.shards = shards
            old = self.current()
            return self._publish(old.version, old.experts, old.router, old.matrix)

    def lexical_built(self, lexical: LexicalIndex, version: int, sample: CentralSample | None = None) -> None:
        """A BM25 rebuild (built at catalogue `version`, with its central sample): the same state with them."""
        with self._lock:
            old = self.current()
            self._lexical, self._lexical_version, self._sample = lexical, version, sample
            if isinstance(old.index, ShardedIndex) and self.shards is not None:  # over the shards again
                self._publish(old.version, old.experts, old.router, old.matrix)
                return
            self._serial += 1
            self._state = replace(old, serial=self._serial, lexical=lexical, lexical_version=version, sample=sample)

    def _publish(
        self,
        version: int,
        experts: Mapping[int, ExpertProfile],
        router: Router | None,
        matrix: ExpertMatrix | None,
    ) -> ServingState:
        self._serial += 1
        held = self.indexes.index
        index: SearchIndex | None = held if isinstance(held, ClusteredIndex) else None
        lexical: LexicalIndex | ShardedLexical | None = self._lexical
        shard_map = None
        if self.shards is not None:
            # Searched at this state's catalogue version or later: a shard's lists follow the
            # mapping as well as the index log (a list moved to it must be there before it answers).
            position = max(version, self.indexes.position)
            sharded = self.shards.index_over(held, experts, position)
            index, shard_map = sharded, sharded.shard_map
            if self._lexical is not None:  # BM25's postings on the shards, its statistics from here
                # With a central sample the route asks the shards nothing: no summary of BM25's best
                # first; the searches bring their lists' best scores (engine.sharded_lexical).
                lexical = self.shards.lexical_over(self._lexical.stats, sharded, position, self._sample is None)
        if index is None:
            raise RuntimeError("this server holds no vectors (MOERAG_SHARD_MAP) and has no shards to search")
        state = ServingState(
            version=version,
            serial=self._serial,
            experts=experts,
            router=router,
            index=index,
            index_position=self.indexes.position,
            lexical=lexical,
            lexical_version=self._lexical_version,
            matrix=matrix,
            shard_map=shard_map,
            sample=self._sample,
        )
        self._state = state  # the one reference swap: a question sees the old state or this one, whole
        return state

    def _matrix(self, experts: Mapping[int, ExpertProfile], previous: ExpertMatrix | None = None) -> ExpertMatrix:
        """The expert-sorted embeddings for the scoped kernel, read from SQL (keeping `previous`'s
        measured kernel choice while its size holds)."""
        dim = self.indexes.dim
        with self.sessions() as s:
            owner = cluster_owners(s)
            rows = s.execute(select(Chunk.id, Chunk.cluster_id, Chunk.embedding)).all()
        ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        owners = np.fromiter((owner.get(r[1]) or -1 for r in rows), dtype=np.int64, count=len(rows))
        x = stack((r[2] for r in rows), dim)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        # auto: float16 on a GPU, half the bytes a search reads, the same top 10 on dev (matrix-dtype.json)
        dtype = self.matrix_dtype if self.matrix_dtype != "auto" else "float16" if device == "cuda" else "float32"
        return ExpertMatrix(
            ids, x, owners, sorted(experts), device=device, dtype=getattr(torch, dtype), previous=previous
        )
