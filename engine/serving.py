"""One serving state: everything a question reads, as of one catalogue version, in one object.

A state is immutable and published by one reference swap (the way Lucene's `SearcherManager`
publishes searchers): a question takes `current()` once, at its start, and reads only that
state, so it never pairs a router with another moment's experts, mapping or clustering. The
app builds the next state off the question path, when the catalogue moves, and swaps it in.

What the state pins and what it shares:

- `experts` (profiles with their clusters: the cluster -> expert mapping) and `router`: the
  versions committed at `version`.
- `index`: the replica handle. A new clustering is a new object, so a state keeps the lists it
  was built with; chunks added or removed within those lists are applied to the handle in place
  (`index_position` is the catalogue version it held when the state was built). A question may
  therefore also see chunks committed after its state; never another clustering.
- `lexical`: the BM25 index (immutable) and `lexical_version`, the catalogue version it was
  built at. BM25 rebuilds are spaced (app.serving.lexical), so it may lag `version`; its
  rebuild publishes a new state at the same version (a new `serial`).
- `matrix`: the expert-sorted copy for the scoped kernel, built with the state (GPU only).
- `shard_map`: with expert shards (index.shards), `index` is the replica's lists spread over
  the shards the map names, and this is the map's version.
- `sample`: the central sample (engine.central_sample) built with BM25; when set, the gate's vote
  and the route's check read it (`route_index`) instead of the index.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from engine.central_sample import CentralSample
from engine.lexical import LexicalIndex
from engine.sharded_lexical import ShardedLexical
from index import SearchIndex

if TYPE_CHECKING:  # annotations only: a shard replica reads profiles without loading torch
    from engine.expert_matrix import ExpertMatrix
    from engine.router import Router


@dataclass(frozen=True)
class ExpertProfile:
    id: int
    name: str
    system_prompt: str
    generator: str
    top_k: int
    threshold: float | None
    clusters: tuple[int, ...]
    slugs: tuple[str, ...] = ()  # model-id tails, the current one first (app.services.chat)


@dataclass(frozen=True)
class ServingState:
    version: int  # the catalogue version of the experts, mapping and router
    serial: int  # publication number: any change to what a question reads gives a new one
    experts: Mapping[int, ExpertProfile]
    router: Router | None
    index: SearchIndex
    index_position: int
    lexical: LexicalIndex | ShardedLexical | None = None  # BM25: whole here, or its postings on the shards
    lexical_version: int = 0
    matrix: ExpertMatrix | None = None
    shard_map: str | None = None  # the shard map's version when the index is spread over shards
    # The central sample (engine.central_sample), built with BM25: what the route reads, when set.
    sample: CentralSample | None = None

    @cached_property
    def route_index(self) -> SearchIndex:
        """What the gate's vote and the route check search: the sample over the index's lists, else the index."""
        return self.sample.over(self.index) if self.sample is not None else self.index

    @cached_property
    def mapped(self) -> tuple[str, ...]:
        """Names of the experts that own lists: with fewer than two there is no gate to route between."""
        return tuple(e.name for e in self.experts.values() if e.clusters)

    @property
    def versions(self) -> dict[str, int | str | None]:
        """What a response records: the versions this state was built from."""
        return {
            "catalogue_version": self.version,
            "router_version": self.router.version_id if self.router is not None else None,
            "index_position": self.index_position,
            "bm25_version": self.lexical_version if self.lexical is not None else None,
            "shard_map": self.shard_map,
        }


def fixed_state(
    index: SearchIndex,
    experts: Mapping[int, ExpertProfile] | None = None,
    router: Router | None = None,
    lexical: LexicalIndex | None = None,
) -> ServingState:
    """A state for code that serves one fixed store (benchmarks, unit tests): version 0."""
    return ServingState(0, 0, dict(experts or {}), router, index, 0, lexical)
