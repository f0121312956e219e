"""Expert shards over the FAISS API: an index carved into parts that each hold some of its lists,
searched apart and merged exactly, behind the read API of one `ClusteredIndex`.

Expert parallelism, as in MoE serving: every list (an IVF cluster) belongs to one expert, every
expert to one shard (`shard_of_lists`), and a shard holds only its lists' vectors (`carve`) with
all the centroids, so list ids agree everywhere. `ShardedIndex` answers what the ask flow asks of
an index: a search over some lists goes only to the shards holding them, over every list to every
shard, and the partial top-k are merged (`merge_topk`, FAISS GPU's k-selection merge pass); the
same FAISS scan on the same vectors gives the same ids and scores (ties by id here, by scan in
FAISS). What needs no vectors stays beside them (index.list_map: 16 bytes a chunk, not 1.5 kB)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from index.list_map import ListFacts, ListMap
from index.store import Ask, ClusteredIndex, IdSet, SearchIndex

log = logging.getLogger(__name__)
Floats = npt.NDArray[np.float32]
Ints = npt.NDArray[np.int64]


# A shard's answer: (scores [Q, k], ids [Q, k]), or with the catalogue versions its content lies
# between (scores, ids, lo, hi) when the shard follows the catalogue on its own (app.shards.replicas),
# and when the search carried the question's BM25 weights, the ids' BM25 scores [Q, k] and the
# shard's best BM25 score in each list it holds (lists [L], best [L]: lists with a hit only).
Answer = (
    tuple[Floats, Ints]
    | tuple[Floats, Ints, int, int]
    | tuple[Floats, Ints, int, int, Floats]
    | tuple[Floats, Ints, int, int, Floats, Ints, Floats]
)


class PendingSearch(Protocol):
    """A shard's answer to come: a `concurrent.futures.Future`, a Ray Serve `DeploymentResponse`."""

    def result(self) -> Answer: ...


class ShardSearch(Protocol):
    """(queries [Q, D], k, lists to scan, at catalogue version `at_least` or later; None: the
    state's) -> its answer to come: a shard's search, in this process or behind a Serve handle."""

    def __call__(
        self, q: Floats, k: int, lists: Ints, at_least: int | None = None, bm25: object | None = None
    ) -> PendingSearch: ...


class ShardRows(Protocol):
    """(queries [Q, D], k, each row's lists to scan, only ids <= `through` when given, at catalogue
    version `at_least` or later) -> its answer to come: a shard's `ClusteredIndex.search_rows`."""

    def __call__(
        self, q: Floats, k: int, lists: Sequence[Ints], through: int | None = None, at_least: int | None = None
    ) -> PendingSearch: ...


ROWS_A_CALL = 256  # rows a shard's row search is sent at most (a router's probe sends thousands)
_FAILED: ContextVar[list[str] | None] = ContextVar("moerag_failed_shards", default=None)


@dataclass
class _Bm25Alongside:
    weights: object | None = None  # the question's BM25 term weights (engine.lexical.QueryWeights)
    found: dict[int, float] = field(default_factory=dict)  # chunk id -> its BM25 score, from the shards
    best: dict[int, float] = field(default_factory=dict)  # list -> its best BM25 score, from the shards
    covered: set[int] = field(default_factory=set)  # the shards whose answers brought their lists' best
    deadline: float | None = None  # monotonic time by which all the question's shard calls must answer


_BM25: ContextVar[_Bm25Alongside | None] = ContextVar("moerag_bm25_alongside", default=None)


@contextmanager
def shard_failures() -> Iterator[list[str]]:
    """One question's dealings with the shards, in this thread, while the block runs: collects the
    names of the shards whose search failed or timed out (the caller's answer is then partial: it
    was merged from the others), and carries the question's BM25 weights once offered
    (`offer_bm25`) with every shard search, whose answers then bring their chunks' BM25 scores
    (`bm25_found`): the fusion needs no call of its own for the dense candidates' scores."""
    failed: list[str] = []
    token, bm25 = _FAILED.set(failed), _BM25.set(_Bm25Alongside())
    try:
        yield failed
    finally:
        _FAILED.reset(token)
        _BM25.reset(bm25)


def offer_bm25(weights: object) -> None:
    """The question's BM25 term weights, sent with its shard searches from now on (within `shard_failures`)."""
    holder = _BM25.get()
    if holder is not None:
        holder.weights = weights


def bm25_found() -> dict[int, float]:
    """{chunk id: BM25 score} the question's shard searches brought so far (empty outside `shard_failures`)."""
    holder = _BM25.get()
    return holder.found if holder is not None else {}


def bm25_best() -> tuple[dict[int, float], set[int]]:
    """({list: its best BM25 score}, the shards that brought theirs): what the question's shard
    searches brought so far; a list of a covered shard with no score has no chunk sharing a term."""
    holder = _BM25.get()
    return (holder.best, holder.covered) if holder is not None else ({}, set())


class DeadlineSpent(TimeoutError):
    """A shard call that had (almost) no time left when it was sent: the question's deadline was
    spent waiting on another shard, so the answer is partial but this shard is not to blame (its
    breaker does not count it)."""


def question_deadline(budget_s: float) -> float:
    """The monotonic time by which the current question's shard calls must all be answered: one
    budget a question (set by its first shard call: now + `budget_s`), not one a call, so stages
    that follow one another share it. Outside a question (`shard_failures`): now + `budget_s`."""
    holder = _BM25.get()
    now = time.monotonic()
    if holder is None:
        return now + budget_s
    if holder.deadline is None:
        holder.deadline = now + budget_s
    return holder.deadline


def record_failure(shard: str, what: str, *, skipped: bool = False) -> None:
    """A shard failed or did not answer in time (or was `skipped`: its breaker is open): logged,
    and named to `shard_failures` when it collects."""
    if skipped:
        log.debug("shard %s skipped for %s: its breaker is open", shard, what)
    else:
        log.warning("shard %s did not answer %s", shard, what, exc_info=True)
    failed = _FAILED.get()
    if failed is not None:
        failed.append(shard)


class ShardBreakers:
    """A circuit breaker per shard. Closed: the shard is asked. A failure or a timeout opens it:
    the shard is skipped (the answer is partial at once, no wait) for a back-off that doubles with
    each failure in a row (`base_s` .. `max_s`); then it is half-open: it is probed, and success
    closes it, another failure opens it again for longer. With a `probe` (a light call to the
    shard: its answer or an error), the probe runs on a thread of its own when the back-off ends
    (with no question coming, too: readiness comes back by itself) and the shard stays skipped
    until it answers, so no question waits on a shard that is still stuck; without one, the next
    question's call is the probe. Shared by every serving state of a process (the states
    come and go; a shard's health does not)."""

    def __init__(
        self, shards: int, base_s: float = 0.5, max_s: float = 10.0, probe: Callable[[int], object] | None = None
    ) -> None:
        self.base_s, self.max_s, self.probe = base_s, max_s, probe
        self._lock = threading.Lock()
        self._failures = [0] * shards  # failures in a row
        self._open_until = [0.0] * shards  # monotonic time the back-off ends (0: closed)
        self._probing = [0.0] * shards  # when the half-open probe in flight was let through (0: none)
        self.calls = [0] * shards  # calls let through
        self.errors = [0] * shards  # calls that failed or timed out
        self.skipped = [0] * shards  # calls not made: the breaker was open

    def allow(self, shard: int) -> bool:
        """Whether to ask `shard` now (counted); False: skip it."""
        with self._lock:
            until, now = self._open_until[shard], time.monotonic()
            # A probe whose answer was never read (a question that did not need it) stops holding
            # the shard after the longest back-off: the next call probes again.
            probing = self._probing[shard] and now - self._probing[shard] < self.max_s
            if until and (now < until or probing):
                self.skipped[shard] += 1
                return False
            if until:  # the back-off is over: probe it (on its own thread, or with this call)
                self._probing[shard] = now
                if self.probe is not None:
                    self.skipped[shard] += 1
                    self._start_probe(shard)
                    return False
            self.calls[shard] += 1
            return True

    def _start_probe(self, shard: int) -> None:
        threading.Thread(target=self._probe, args=(shard,), name=f"shard-probe-{shard}", daemon=True).start()

    def _probe_when_due(self, shard: int, until: float) -> None:
        """The back-off that ended at `until` is over: probe, unless a question's call did already
        or the breaker changed since."""
        with self._lock:
            if self._open_until[shard] != until or self._probing[shard]:
                return
            self._probing[shard] = time.monotonic()
        self._probe(shard)

    def _probe(self, shard: int) -> None:
        assert self.probe is not None
        try:
            self.probe(shard)
        except Exception as exc:  # still down or stuck: open again, for longer
            log.info("shard %d still does not answer its probe: %s", shard, exc)
            self.failed(shard)
        else:
            self.ok(shard)

    def probe_now(self) -> None:
        """Every open breaker's back-off ends now (the shards may be back: a reconnection): each
        is probed now (with a probe), or by the next question's call."""
        due: list[tuple[int, float]] = []
        with self._lock:
            for shard, until in enumerate(self._open_until):
                if until:
                    now = self._open_until[shard] = time.monotonic()
                    self._probing[shard] = 0.0
                    due.append((shard, now))
        if self.probe is not None:
            for shard, until in due:
                threading.Thread(target=self._probe_when_due, args=(shard, until), daemon=True).start()

    def ok(self, shard: int) -> None:
        with self._lock:
            self._failures[shard], self._open_until[shard], self._probing[shard] = 0, 0.0, 0.0

    def failed(self, shard: int) -> None:
        with self._lock:
            self.errors[shard] += 1
            self._failures[shard] += 1
            backoff = min(self.max_s, self.base_s * 2 ** (self._failures[shard] - 1))
            until = self._open_until[shard] = time.monotonic() + backoff
            self._probing[shard] = 0.0
        if self.probe is not None:  # probed when the back-off ends, questions or not
            timer = threading.Timer(backoff, self._probe_when_due, (shard, until))
            timer.daemon = True
            timer.start()

    def state(self, shard: int) -> str:
        """ "closed", "open" (skipped until its back-off ends) or "half-open" (the next call probes)."""
        with self._lock:
            until = self._open_until[shard]
        if not until:
            return "closed"
        return "open" if time.monotonic() < until else "half-open"


def shard_of_lists(owners: Sequence[int | None], shard_of_expert: Mapping[int, int], default: int = 0) -> Ints:
    """[C] the shard holding each list: its expert's shard; `default` for a list no expert owns
    (or whose expert the map does not name)."""
    return np.array([shard_of_expert.get(e, default) if e is not None else default for e in owners], dtype=np.int64)


def carve(index: ClusteredIndex, lists: Iterable[int], version: str | None = None) -> ClusteredIndex:
    """A new index with all of `index`'s centroids holding only the vectors of `lists`."""
    return index.subset(lists, version if version is not None else index.version)


def merge_topk(parts: Sequence[tuple[Floats, Ints]], k: int) -> tuple[Floats, Ints]:
    """Partial results (scores [Q, k_i], ids [Q, k_i]) -> the best k of their union, [Q, k] each,
    best first; ties by lower id; missing slots (id -1) last, as FAISS fills them (-inf, -1). An
    id in two parts (a chunk moving between shards, found by both) counts once."""
    if not parts:
        raise ValueError("nothing to merge")
    scores = np.concatenate([s for s, _ in parts], axis=1)  # [Q, S]
    ids = np.concatenate([i for _, i in parts], axis=1)  # [Q, S]
    scores = np.where(ids >= 0, scores, -np.inf).astype(np.float32)
    order = np.lexsort((np.where(ids >= 0, ids, np.iinfo(np.int64).max), -scores), axis=1)  # [Q, S]
    scores, ids = np.take_along_axis(scores, order, axis=1), np.take_along_axis(ids, order, axis=1)
    again = np.zeros(ids.shape, dtype=bool)  # [Q, S] the same vector's second copy sorts beside its first
    again[:, 1:] = (ids[:, 1:] == ids[:, :-1]) & (ids[:, 1:] >= 0)
    if again.any():
        scores = np.where(again, -np.inf, scores).astype(np.float32)
        keep = np.argsort(np.where(again, 1, 0), axis=1, kind="stable")  # [Q, S] copies last, order kept
        scores, ids = np.take_along_axis(scores, keep, axis=1), np.take_along_axis(ids, keep, axis=1)
    top_scores, top_ids = scores[:, :k], ids[:, :k]  # [Q, k]
    q = len(ids)
    if top_ids.shape[1] < k:  # fewer candidates than k in all
        pad = k - top_ids.shape[1]
        top_scores = np.hstack([top_scores, np.full((q, pad), -np.inf, dtype=np.float32)])
        top_ids = np.hstack([top_ids, np.full((q, pad), -1, dtype=np.int64)])
    top_ids = np.where(np.isfinite(top_scores), top_ids, -1)
    return top_scores, top_ids


def local_search(part: ClusteredIndex) -> ShardSearch:
    """A shard in this process (tests, one machine): its search, as a done future."""

    def search(
        q: Floats, k: int, lists: Ints, at_least: int | None = None, bm25: object | None = None
    ) -> PendingSearch:
        done: Future[Answer] = Future()
        done.set_result(part.search(q, k, lists))
        return done

    return search


def local_rows(part: ClusteredIndex) -> ShardRows:
    """A shard's row search in this process (tests, one machine), as a done future."""

    def rows(
        q: Floats, k: int, lists: Sequence[Ints], through: int | None = None, at_least: int | None = None
    ) -> PendingSearch:
        done: Future[Answer] = Future()
        done.set_result(part.search_rows(q, k, lists, through))
        return done

    return rows


class ShardedIndex(ListFacts):
    """The read API of `ClusteredIndex` over shards: vectors live in the shards, searched through
    `searches[s]`; centroids and the id -> list assignment are kept here.

    `lists_of_shard[s]`: the lists shard s holds (every list in exactly one shard); `rows[s]`: its
    row search (each row over its own lists), for the batched probes (`search_rows`)."""

    def __init__(
        self,
        skeleton: ClusteredIndex | ListMap,
        lists_of_shard: Sequence[Ints],
        searches: Sequence[ShardSearch],
        version: str | None = None,
        shard_map: str = "",
        names: Sequence[str] | None = None,
        rows: Sequence[ShardRows] | None = None,
        breakers: ShardBreakers | None = None,
    ) -> None:
        # One version's arrays: a ListMap's as they are (no copy, no count), an index's read out.
        view = (
            skeleton.view() if isinstance(skeleton, ListMap) else self.view_of(*skeleton.assignments(), skeleton.nlist)
        )
        super().__init__(skeleton.centroids(), version if version is not None else skeleton.version, view)
        self.shard_map = shard_map  # the shard map's version, recorded with answers
        shard = np.full(self.nlist, -1, dtype=np.int64)
        for s, lists in enumerate(lists_of_shard):
            shard[np.asarray(lists, dtype=np.int64)] = s
        if (shard < 0).any():
            raise ValueError(f"lists held by no shard: {np.flatnonzero(shard < 0)[:20].tolist()}")
        self.shard_of_list = shard  # [C]
        self.searches = list(searches)
        self.rows = list(rows) if rows is not None else None
        self.names = list(names) if names is not None else [str(s) for s in range(len(self.searches))]
        self.calls: list[int] = [0] * len(self.searches)  # searches sent to each shard
        self.breakers = breakers  # a shard that failed is skipped for a back-off (None: always asked)
        self.reasked = 0  # shard answers asked again to bring them to one cut

    def shards_of(self, clusters: Iterable[int] | None = None) -> list[int]:
        """The shards a search over `clusters` (None: every list) goes to."""
        lists = np.arange(self.nlist) if clusters is None else self._valid_lists(clusters)
        return sorted({int(s) for s in self.shard_of_list[lists]})

    # ---- search --------------------------------------------------------------------------------

    def search(
        self, q: Floats, k: int, clusters: Iterable[int] | None = None, within: IdSet | None = None
    ) -> tuple[Floats, Ints]:
        """As `ClusteredIndex.search`: q [Q, D] -> (scores [Q, k], ids [Q, k]); only the shards
        holding the lists are asked, all at once, and their top-k merged."""
        return self.search_each(q, [(k, clusters)], within)[0]

    def search_each(self, q: Floats, asks: Sequence[Ask], within: IdSet | None = None) -> list[tuple[Floats, Ints]]:
        """Several searches of q [Q, D], each (k, lists): every shard call of every search is sent
        before any answer is awaited (a confident question's scoped search and its route check's
        probe travel together: one round trip, not two). Results in order."""
        if within is not None:  # the app refuses scoped callers over shards before any search
            raise ValueError("a search within some chunk ids is not sent to expert shards")
        q = np.ascontiguousarray(q, dtype=np.float32)
        if q.ndim != 2 or q.shape[1] != self.dim:
            raise ValueError(f"queries must be [Q, {self.dim}], got {q.shape}")
        if any(k <= 0 for k, _ in asks):
            raise ValueError("k must be positive")
        every = np.arange(self.nlist, dtype=np.int64)
        wanted = [every if clusters is None else self._valid_lists(clusters) for _, clusters in asks]
        mine = [
            {int(s): lists[self.shard_of_list[lists] == s] for s in np.unique(self.shard_of_list[lists])}
            for lists in wanted
        ]
        sent = [self._send(q, k, m, None) for (k, _), m in zip(asks, mine, strict=True)]
        out = []
        for (k, _), m, pending in zip(asks, mine, sent, strict=True):
            answers = self._collect(pending)
            # One cut: a chunk moving between two shards is in the one it leaves until that shard's
            # version passes the move, and in the one it enters from then on. Shards follow on their
            # own, so a shard whose content may be older than another's newest is asked again at
            # that version: no moving chunk is then missed (one found twice is merged once).
            stamped = {s: (a[2], a[3]) for s, a in answers.items() if len(a) >= 4}
            if len(stamped) > 1:
                target = max(hi for _, hi in stamped.values())
                behind = {s: m[s] for s, (lo, _) in stamped.items() if lo < target}
                if behind:
                    self.reasked += len(behind)
                    for s in behind:
                        del answers[s]
                    answers |= self._collect(self._send(q, k, behind, target))
            if not answers:
                out.append((np.full((len(q), k), -np.inf, dtype=np.float32), np.full((len(q), k), -1, dtype=np.int64)))
            else:
                out.append(merge_topk([(a[0], a[1]) for a in answers.values()], k))
        return out

    def _send(
        self, q: Floats, k: int, lists_of: Mapping[int, Ints], at_least: int | None
    ) -> list[tuple[int, PendingSearch]]:
        """Each shard of `lists_of` asked over its lists; a shard that cannot even be asked is
        left out (and named: `shard_failures`)."""
        pending: list[tuple[int, PendingSearch]] = []
        holder = _BM25.get()
        bm25 = holder.weights if holder is not None else None
        for s, its_lists in lists_of.items():
            if not self._allow(s):
                continue
            self.calls[s] += 1
            try:
                search = self.searches[s]
                pending.append(
                    (s, search(q, k, its_lists, at_least, bm25) if bm25 else search(q, k, its_lists, at_least))
                )
            except Exception:  # not even sent (no replica to take it)
                self._failed(s)
        return pending

    def _collect(self, pending: list[tuple[int, PendingSearch]]) -> dict[int, Answer]:
        """{shard: its answer}; a shard that fails or times out is left out (and named)."""
        answers: dict[int, Answer] = {}
        holder = _BM25.get()
        for s, p in pending:
            try:
                answers[s] = p.result()
            except Exception as exc:  # a shard down or too slow: the others answer; the caller is told
                self._failed(s, blame=not isinstance(exc, DeadlineSpent))
                continue
            if self.breakers is not None:
                self.breakers.ok(s)
            if holder is not None and len(answers[s]) >= 5:  # its chunks' BM25 scores, for the fusion
                ids, bm25 = answers[s][1], answers[s][4]  # type: ignore[misc]
                holder.found.update(
                    (i, b) for i, b in zip(ids.ravel().tolist(), bm25.ravel().tolist(), strict=True) if i >= 0
                )
            if holder is not None and len(answers[s]) == 7:  # and its lists' best: the fusion's scale
                lists, best = answers[s][5], answers[s][6]  # type: ignore[misc]
                for c, b in zip(lists.tolist(), best.tolist(), strict=True):
                    holder.best[c] = max(b, holder.best.get(c, 0.0))
                holder.covered.add(s)
        return answers

    def _allow(self, shard: int) -> bool:
        """Whether to ask `shard` now; a shard whose breaker is open is skipped and named at once."""
        if self.breakers is None or self.breakers.allow(shard):
            return True
        record_failure(self.names[shard], "a search", skipped=True)
        return False

    def _failed(self, shard: int, blame: bool = True) -> None:
        if self.breakers is not None and blame:
            self.breakers.failed(shard)
        record_failure(self.names[shard], "a search")

    def search_rows(
        self, q: Floats, k: int, lists: Sequence[Iterable[int]], through: int | None = None
    ) -> tuple[Floats, Ints]:
        """As `ClusteredIndex.search_rows`: each row of q [Q, D] over its own lists, only ids <= `through`
        when given; every shard holding a row's lists asked once for all rows, merged row by row. One
        row (a question's vote), or no row search (`rows`): `search` a row (one cut, BM25 alongside)."""
        q = np.ascontiguousarray(q, dtype=np.float32)
        wanted = [self._valid_lists(row) for row in lists]
        if len(q) > ROWS_A_CALL and self.rows is not None:  # calls of bounded size, each within the wait
            parts = [
                self.search_rows(q[i : i + ROWS_A_CALL], k, wanted[i : i + ROWS_A_CALL], through)
                for i in range(0, len(q), ROWS_A_CALL)
            ]
            return np.vstack([p[0] for p in parts]), np.vstack([p[1] for p in parts])
        if self.rows is None or (through is None and len(q) == 1):
            if through is not None:
                raise ValueError("an id bound needs the shards' row search")
            found = [self.search(q[i : i + 1], k, w) for i, w in enumerate(wanted)]
            return np.vstack([f[0] for f in found]), np.vstack([f[1] for f in found])
        shards = {int(s) for w in wanted for s in self.shard_of_list[w]}
        pending: list[tuple[int, PendingSearch]] = []
        for s in sorted(shards):
            if not self._allow(s):
                continue
            self.calls[s] += 1
            try:
                pending.append((s, self.rows[s](q, k, [w[self.shard_of_list[w] == s] for w in wanted], through)))
            except Exception:
                self._failed(s)
        answers = self._collect(pending)
        if not answers:
            return np.full((len(q), k), -np.inf, dtype=np.float32), np.full((len(q), k), -1, dtype=np.int64)
        return merge_topk([(a[0], a[1]) for a in answers.values()], k)

    def search_nearest(self, q: Floats, k: int, nprobe: int) -> tuple[Floats, Ints, int]:
        """As `ClusteredIndex.search_nearest`: each row searches its own `nprobe` nearest lists."""
        lists = self._nearest_each(q, nprobe)
        scores, ids = self.search_rows(q, k, lists)
        return scores, ids, sum(int(self.list_sizes()[w].sum()) for w in lists)

    def neighbours(self, q: Floats, k: int, nprobe: int, through: int | None = None) -> tuple[Floats, Ints]:
        """As `ClusteredIndex.neighbours`: each row's k nearest in its `nprobe` nearest lists (ids <= `through`)."""
        return self.search_rows(q, k, self._nearest_each(q, nprobe), through)

    def _nearest_each(self, q: Floats, nprobe: int) -> list[Ints]:
        every = np.arange(self.nlist, dtype=np.int64)
        return [self.nearest_lists(row, every, max(1, min(nprobe, self.nlist))) for row in np.asarray(q, np.float32)]


def as_search_index(index: ShardedIndex) -> SearchIndex:
    """The sharded index where a `SearchIndex` is expected (mypy checks that it is one)."""
    return index
