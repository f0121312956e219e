"""The serving side of the Ray tier (app.shards.replicas deploys it): handles to a shard map's
deployments, the sharded view of an index a serving state holds (`RayShards.index_over`), each
shard's figures for `moerag ray status` and the console, and the bounded wait on a shard's answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from app.shards.link import LinkedResponse, ShardLink
from app.shards.map import ShardMap
from app.shards.replicas import join, replica_states, require
from engine.lexical import QueryWeights, TermStats
from engine.serving import ExpertProfile
from engine.sharded_lexical import LexicalShard, ShardedLexical
from index import ClusteredIndex
from index.list_map import ListMap
from index.shards import DeadlineSpent, ShardBreakers, ShardedIndex, ShardRows, ShardSearch, question_deadline

log = logging.getLogger(__name__)


def handle(shard_map: ShardMap, shard: str) -> Any:
    """A shard deployment's Serve handle."""
    return require().get_deployment_handle(f"shard-{shard}", app_name=shard_map.app_name)


class RayShards:
    """The serving side: the shard map's deployments, and the sharded view of an index that the
    serving state holds instead of the index (app.serving.states)."""

    def __init__(
        self, shard_map: ShardMap, address: str = "auto", timeout_seconds: float = 5.0, link: ShardLink | None = None
    ) -> None:
        """link: the server's child process joined to Ray (app.shards.link), through which every
        call goes; None: this process joins Ray itself (the CLI, tests, benchmarks)."""
        self.shard_map, self.timeout_seconds, self.link = shard_map, timeout_seconds, link
        if link is None:
            require()
            join(address)
            self.handles = [handle(shard_map, s.name) for s in shard_map.shards]
        else:
            self.handles = [link.handle(shard_map.app_name, f"shard-{s.name}") for s in shard_map.shards]
        self.sent = [0] * len(shard_map.shards)  # searches this process sent each shard (the console's load)
        # A shard that failed or timed out is skipped for a back-off, then probed apart from the
        # questions (its `stats`, within a question's wait) until it answers (index.shards).
        self.breakers = ShardBreakers(len(shard_map.shards), probe=self._probe)
        self.reasked = [0] * len(shard_map.shards)  # of them, asked again for one cut (index.shards)
        if link is not None:  # Ray back after a loss: probe every shard now, not after its back-off
            link.on_up(self.breakers.probe_now)
            self.warm()

    def warm(self, timeout_s: float = 30.0) -> None:
        """Ask each shard for its figures once, so the link's child holds its handles and Serve's
        routing tables before the first question (a first call can take seconds on a busy machine);
        a shard that does not answer opens its breaker: it is skipped, and `/readyz` says
        degraded, until its probe answers."""
        pending = [(s.name, h.stats.remote()) for s, h in zip(self.shard_map.shards, self.handles, strict=True)]
        for shard, (name, response) in enumerate(pending):
            try:
                response.result(timeout_s=timeout_s)
            except Exception as exc:
                log.warning("shard %s did not answer its first call within %.0f s: %s", name, timeout_s, exc)
                self.breakers.failed(shard)

    def index_over(
        self, index: ClusteredIndex | ListMap, experts: Mapping[int, ExpertProfile], position: int = 0
    ) -> ShardedIndex:
        """`index`'s lists spread over the shards as the map says for `experts`, each shard searched
        at catalogue version `position` or later (the state's)."""
        lists = self.shard_map.lists_of_shards(experts, index.nlist)
        names = [s.name for s in self.shard_map.shards]
        found = [self._counted(n, f) for n, f in enumerate(searches(self.handles, self.timeout_seconds, position))]
        rows = [self._rows(h, position) for h in self.handles]
        return ShardedIndex(
            index, lists, found, shard_map=self.shard_map.version, names=names, rows=rows, breakers=self.breakers
        )

    def _probe(self, shard: int) -> None:
        """A breaker's probe: shard `shard` answers its figures within a question's wait, or raises."""
        self.handles[shard].stats.remote().result(timeout_s=self.timeout_seconds)

    def _rows(self, handle: Any, position: int) -> ShardRows:
        """A shard's row search (`ShardReplica.rows`), within twice a search's wait: it carries many rows."""

        def rows(q: Any, k: int, lists: Any, through: int | None = None, at_least: int | None = None) -> _Within:
            at = position if at_least is None else max(position, at_least)
            return _Within(lambda: handle.rows.remote(q, k, lists, through, at), 2 * self.timeout_seconds)

        return rows

    def lexical_over(
        self, stats: TermStats, index: ShardedIndex, position: int = 0, summary: bool = True
    ) -> ShardedLexical:
        """BM25 over the shards: each replica scores its chunks' postings with `stats`' term
        weights (engine.sharded_lexical), at catalogue version `position` or later, within the
        same bounded wait as a search; `summary`: every shard asked for its best at a question's start."""

        def through(handle: Any) -> LexicalShard:
            def ask(w: QueryWeights, k: int, lists: Any, ids: Any) -> _Within:
                return _Within(lambda: handle.lexical.remote(w, k, lists, ids, position), self.timeout_seconds)

            return ask

        names = [s.name for s in self.shard_map.shards]
        shards = [through(h) for h in self.handles]
        return ShardedLexical(stats, shards, names, index, breakers=self.breakers, summary=summary)

    def _counted(self, shard: int, search: ShardSearch) -> ShardSearch:
        def counted(
            q: npt.NDArray[np.float32],
            k: int,
            lists: npt.NDArray[np.int64],
            at_least: int | None = None,
            bm25: object | None = None,
        ) -> Any:
            self.sent[shard] += 1  # a count for operators: a lost increment under races is harmless
            self.reasked[shard] += at_least is not None
            return search(q, k, lists, at_least, bm25)

        return counted

    def stats(self) -> list[dict[str, Any]]:
        return shard_stats(self.shard_map, self.handles, states=self._replica_states)

    def _replica_states(self, app_name: str) -> dict[str, dict[str, int]] | None:
        return replica_states(app_name) if self.link is None else self.link.replica_states(app_name)

    def health(self) -> list[dict[str, Any]]:
        """Each shard as this process sees it (no call made): calls let through, errors and
        timeouts, calls skipped while its breaker was open, the breaker's state now, and whether
        this process reaches Ray at all."""
        b = self.breakers
        ray = self.link is None or self.link.connected.is_set()  # this process's link to Ray (app.shards.link)
        return [
            {
                "shard": s.name,
                "calls": b.calls[n],
                "errors": b.errors[n],
                "skipped": b.skipped[n],
                "breaker": b.state(n),
                "ray": "connected" if ray else f"unreachable ({self.link.reason if self.link else ''})",
            }
            for n, s in enumerate(self.shard_map.shards)
        ]

    def overview(self) -> list[dict[str, Any]]:
        """Each shard in map order, for the console: `shard_stats` (a shard none of whose replicas
        answers within 2 s is `reachable: false`), its experts and the searches this process sent it
        (`reasked`: of them, asked again to bring the answer to one cut)."""
        rows = shard_stats(self.shard_map, self.handles, timeout_seconds=2.0, states=self._replica_states)
        for n, (shard, row) in enumerate(zip(self.shard_map.shards, rows, strict=True)):
            row["experts"] = list(shard.experts) + (["(unmapped lists)"] if shard.default else [])
            row["searches"], row["reasked"] = self.sent[n], self.reasked[n]
        return rows


def shard_stats(
    shard_map: ShardMap,
    handles: Sequence[Any],
    timeout_seconds: float | None = None,
    states: Callable[[str], dict[str, dict[str, int]] | None] = replica_states,
) -> list[dict[str, Any]]:
    """Each shard's name, replicas (the map's; `running_replicas`: Serve's count now; `autoscaling`:
    the bounds, when the map sets them), what one of its replicas holds (lists, vectors, position), and
    the round trip of that call (`round_trip_ms`: the hop to the shard, no search in it). With a
    timeout, a shard that does not answer in time is `reachable: false` (its figures None) instead
    of an error."""
    out = []
    running_states = states(shard_map.app_name) or {}
    for s, h in zip(shard_map.shards, handles, strict=True):
        row: dict[str, Any] = {"shard": s.name, "replicas": s.replicas}
        running = running_states.get(f"shard-{s.name}", {}).get("RUNNING")
        row["running_replicas"] = running  # None: Serve could not say
        if s.autoscaling is not None:
            row["autoscaling"] = [s.autoscaling.min_replicas, s.autoscaling.max_replicas]
        start = time.perf_counter()
        try:
            row |= h.stats.remote().result(timeout_s=timeout_seconds)
        except Exception:  # down, restarting, or too slow
            if timeout_seconds is None:
                raise
            row |= {"reachable": False, "lists": None, "vectors": None, "position": None, "round_trip_ms": None}
        else:
            row |= {"reachable": True, "round_trip_ms": round((time.perf_counter() - start) * 1000, 2)}
        out.append(row)
    return out


def searches(handles: Sequence[Any], timeout_seconds: float | None = None, position: int = 0) -> list[ShardSearch]:
    """Each shard's search through its Serve handle (any replica; Serve balances them) at catalogue
    version `position` or later (unless the search names a later one), its answer awaited at most
    `timeout_seconds` (then the shard is left out of the answer: index.shards). A replica that dies
    with the search in flight is asked again (twice at most), within the same time: Serve sends the retry to
    another replica."""

    def through(handle: Any) -> ShardSearch:
        def search(q: Any, k: int, lists: Any, at_least: int | None = None, bm25: object | None = None) -> _Within:
            at = position if at_least is None else max(position, at_least)
            return _Within(lambda: handle.search.remote(q, k, lists, at, bm25), timeout_seconds)

        return search

    return [through(h) for h in handles]


_ASKS = 3  # a search whose replica died is asked again, within the question's deadline, this often in all


class _Within:
    """A shard's answer (a Serve DeploymentResponse) awaited for a bounded time, asked again
    if the replica answering it died. Within a question the bound is the question's one budget
    for all its shard calls (index.shards.question_deadline), so stages in turn never add up."""

    def __init__(self, ask: Callable[[], Any], timeout_seconds: float | None) -> None:
        self.ask, self.timeout_seconds = ask, timeout_seconds
        self.deadline = None if timeout_seconds is None else question_deadline(timeout_seconds)
        # The time this call had when sent: under a tenth of its own bound, a timeout is the
        # question's deadline spent on another shard, not this shard's fault (DeadlineSpent).
        self.given = None if self.deadline is None else self.deadline - time.monotonic()
        self.response = ask()

    def result(self) -> Any:
        if isinstance(self.response, LinkedResponse):  # the link's child asks again itself
            return self._await()
        from ray.exceptions import RayActorError  # the replica died, or cannot be reached

        for _ in range(_ASKS - 1):
            try:
                return self._await()
            except RayActorError as exc:  # Serve may still route to the dead one for a moment
                log.warning("a shard replica died answering a search; asking another: %s", exc)
                self.response = self.ask()
        return self._await()

    def _await(self) -> Any:
        left = None if self.deadline is None else max(self.deadline - time.monotonic(), 0.0)
        try:
            return self.response.result(timeout_s=left)
        except TimeoutError:
            if self.given is not None and self.timeout_seconds and self.given < self.timeout_seconds / 10:
                raise DeadlineSpent("the question's deadline was spent before this shard was asked") from None
            raise
