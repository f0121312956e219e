"""A question's BM25 over expert shards: each shard scores its own chunks' postings with the global
statistics' term weights (engine.postings), and the answers merge into what one index would say.

What the ask flow reads of a question's BM25 (`Terms`): its best chunks over the whole store (the
gate's vote, the route's check), the best score within some lists (the fusion's scale) and the
scores of given chunks (the dense candidates being fused). Over shards:

- at the question's start, while the model embeds it, every shard is asked once for its `depth`
  best chunks and, per list it holds, its best score (`summary`), unless the route reads a
  central sample (engine.central_sample): then no shard is asked until the route's searches, whose
  answers bring their lists' best scores, and a shard is asked for its summary only when a
  scale is wanted over lists no search went to;
- the whole store's best k (k <= depth) and the best within any lists come from those answers;
  a deeper or scoped search asks again (RRF fusion only);
- the dense candidates' scores come with the shard searches that found them (the question's
  weights travel with its searches: index.shards.offer_bm25); any other chunk's are asked of the
  shards holding its list (a chunk moving between shards is in the postings of the one it enters,
  and maybe still of the one it leaves, with the same score: the highest is kept).

A shard that fails or does not answer in time is left out and named (`index.shards.shard_failures`):
the answer is partial, never an error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

import numpy as np
import numpy.typing as npt

from engine.lexical import QueryWeights, TermStats
from engine.postings import Postings
from index import ClusteredIndex, SearchIndex
from index.shards import (
    Answer,
    DeadlineSpent,
    ShardBreakers,
    ShardedIndex,
    ShardSearch,
    bm25_best,
    bm25_found,
    merge_topk,
    offer_bm25,
    record_failure,
)

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float32]


@dataclass(frozen=True)
class LexicalAnswer:
    """A shard's answer: its best chunks (ids [k], scores [k], best first, only chunks sharing a
    term), its best score per list (`lists` [L], `best` [L], lists with a hit only), and the scores of
    the chunks asked about (`of_ids` [n], 0 where it holds no postings for one)."""

    ids: Ints
    scores: Floats
    lists: Ints = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    best: Floats = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    of_ids: Floats = field(default_factory=lambda: np.zeros(0, dtype=np.float32))


class PendingLexical(Protocol):
    def result(self) -> LexicalAnswer: ...


class LexicalShard(Protocol):
    """(weights, k best, within these lists (None: all it holds), scores of these ids) -> its answer to come."""

    def __call__(self, w: QueryWeights, k: int, lists: Ints | None, ids: Ints | None) -> PendingLexical: ...


class ShardedLexical:
    """BM25 over shards, as a serving state holds it in place of a `LexicalIndex`: the global
    statistics here, the postings on the shards."""

    def __init__(
        self,
        stats: TermStats,
        shards: Sequence[LexicalShard],
        names: Sequence[str],
        index: ShardedIndex,
        depth: int = 50,
        breakers: ShardBreakers | None = None,
        summary: bool = True,
    ) -> None:
        """index: the sharded index the shards hold (which shard holds each list, each chunk's list);
        breakers: the shards' (index.shards.ShardBreakers), shared with the dense searches;
        summary: every shard asked for its best chunks at a question's start (False: the route
        reads a central sample, and the searches bring the lists' best scores)."""
        self.stats, self.shards, self.names = stats, list(shards), list(names)
        self.summary = summary
        self.breakers = breakers
        self.shard_of_list, self.clusters_of, self.depth = index.shard_of_list, index.clusters_of, depth

    def __len__(self) -> int:
        return self.stats.n_docs

    def terms(self, question: str, mask_of: object = None) -> ShardedTerms | None:
        """The question's BM25 over the shards (None: no term any chunk has)."""
        w = self.stats.weights(question)
        return ShardedTerms(self, w) if w is not None else None


class ShardedTerms:
    """One question's BM25 over the shards (engine.lexical.Terms)."""

    def __init__(self, lexical: ShardedLexical, w: QueryWeights) -> None:
        self.lexical, self.w = lexical, w
        self._sent: list[tuple[int, PendingLexical]] | None = None

    def prefetch(self) -> None:
        """Ask every shard for its summary now (answers awaited when first read), and send the
        question's weights with its shard searches from now on: their answers bring the found
        chunks' scores (index.shards.offer_bm25), which `scores_of` then need not ask."""
        offer_bm25(self.w)
        if self._sent is None and self.lexical.summary:
            self._sent = self._ask(range(len(self.lexical.shards)), self.lexical.depth, None, None)

    @cached_property
    def _summary(self) -> list[LexicalAnswer]:
        offer_bm25(self.w)
        if self._sent is None:
            self._sent = self._ask(range(len(self.lexical.shards)), self.lexical.depth, None, None)
        return self._collect(self._sent)

    def search(self, k: int, scope: Sequence[int] | None = None) -> list[tuple[int, float]]:
        """The k best chunks (id, score) over the whole store or within `scope`'s lists, best first;
        ties to the lower id."""
        if scope is None and k <= self.lexical.depth:
            answers = self._summary
        else:
            lists = None if scope is None else np.asarray(sorted(set(scope)), dtype=np.int64)
            shards = range(len(self.lexical.shards)) if lists is None else self._shards_of(lists)
            answers = self._collect(self._ask(shards, k, lists, None))
        parts = [(a.scores[None, :], a.ids[None, :]) for a in answers if len(a.ids)]
        if not parts:
            return []
        scores, ids = merge_topk(parts, k)
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if i >= 0 and s > 0]

    def best(self, scope: Sequence[int] | None = None) -> float:
        """The best score over the whole store or within `scope`'s lists; 0 when none shares a term.
        Without a summary, the lists' best scores the question's searches brought, and the summary
        only of the shards holding `scope` that no search asked."""
        best = 0.0
        wanted = None if scope is None else np.asarray(list(scope), dtype=np.int64)
        if self.lexical.summary or "_summary" in self.__dict__:  # asked at the start, or already read
            answers = self._summary
        else:
            brought, covered = bm25_best()
            shards = range(len(self.lexical.shards)) if wanted is None else self._shards_of(wanted)
            missing = [s for s in shards if s not in covered]
            values = brought.values() if wanted is None else [brought.get(int(c), 0.0) for c in wanted]
            best = max(values, default=0.0)
            answers = self._collect(self._ask(missing, 1, None, None)) if missing else []
        for a in answers:
            keep = a.best if wanted is None else a.best[np.isin(a.lists, wanted)]
            best = max(best, float(keep.max(initial=0.0)))
        return best

    def scores_of(self, ids: Sequence[int]) -> Floats:
        """[n] each chunk's score (0 for one no shard holds postings for yet): what the question's
        shard searches brought with the chunks they found, else asked of the shards holding the
        chunks' lists (a chunk entering a shard is in its postings before it answers), every shard
        for a chunk of no list yet."""
        found = bm25_found()  # brought by the question's shard searches
        out = np.array([found.get(int(i), 0.0) for i in ids], dtype=np.float32)  # [n]
        missing = np.array([int(i) not in found for i in ids], dtype=bool)  # [n]
        if missing.any():
            out[missing] = self._ask_scores(np.asarray(ids, dtype=np.int64)[missing])
        return out

    def _ask_scores(self, asked: Ints) -> Floats:
        out = np.zeros(len(asked), dtype=np.float32)
        lists = self.lexical.clusters_of(asked)  # [n]
        everywhere = bool((lists < 0).any())
        shards = range(len(self.lexical.shards)) if everywhere else self._shards_of(lists)
        for a in self._collect(self._ask(shards, 0, None, asked)):
            out = np.maximum(out, a.of_ids)
        return out

    def _shards_of(self, lists: Ints) -> list[int]:
        valid = lists[(lists >= 0) & (lists < len(self.lexical.shard_of_list))]
        return sorted({int(s) for s in self.lexical.shard_of_list[valid]})

    def _ask(
        self, shards: Sequence[int] | range, k: int, lists: Ints | None, ids: Ints | None
    ) -> list[tuple[int, PendingLexical]]:
        sent = []
        breakers = self.lexical.breakers
        for s in shards:
            if breakers is not None and not breakers.allow(s):
                record_failure(self.lexical.names[s], "a BM25 search", skipped=True)
                continue
            try:
                sent.append((s, self.lexical.shards[s](self.w, k, lists, ids)))
            except Exception:  # not even sent (no replica to take it)
                self._failed(s)
        return sent

    def _failed(self, s: int, blame: bool = True) -> None:
        if self.lexical.breakers is not None and blame:
            self.lexical.breakers.failed(s)
        record_failure(self.lexical.names[s], "a BM25 search")

    def _collect(self, sent: list[tuple[int, PendingLexical]]) -> list[LexicalAnswer]:
        answers = []
        for s, pending in sent:
            try:
                answers.append(pending.result())
            except Exception as exc:  # down or too slow: the others answer, the caller is told
                self._failed(s, blame=not isinstance(exc, DeadlineSpent))
                continue
            if self.lexical.breakers is not None:
                self.lexical.breakers.ok(s)
        return answers


def answer_from(
    scores: Floats, ids: Ints, clusters_of: Callable[[Ints], Ints], k: int, lists: Ints | None, asked: Ints | None
) -> LexicalAnswer:
    """A shard's answer from its chunks' scores [N] (ids [N]): its k best (within `lists` when given),
    its best per list, and the scores of the `asked` ids. clusters_of: chunk ids -> their lists (-1:
    not in the shard's index); k = 0: the scores of the `asked` ids alone."""
    of_ids = np.zeros(0, dtype=np.float32)
    if asked is not None and len(asked):
        if len(ids) and not (ids[1:] >= ids[:-1]).all():  # a shard's postings come sorted: no sort per question
            order = np.argsort(ids, kind="stable")
            ids, scores = ids[order], scores[order]
        at = np.minimum(np.searchsorted(ids, asked), max(len(ids) - 1, 0))
        found = (ids[at] == asked) if len(ids) else np.zeros(len(asked), dtype=bool)
        of_ids = np.where(found, scores[at] if len(ids) else 0.0, 0.0).astype(np.float32)
    if k <= 0:
        none = np.zeros(0, dtype=np.int64)
        return LexicalAnswer(none, np.zeros(0, dtype=np.float32), none, np.zeros(0, dtype=np.float32), of_ids)
    hit = np.flatnonzero(scores > 0)  # [H] rows sharing a term
    hit_lists = clusters_of(ids[hit])  # [H]
    if lists is not None:
        keep = np.isin(hit_lists, lists)
        hit, hit_lists = hit[keep], hit_lists[keep]
    top = hit[np.lexsort((ids[hit], -scores[hit]))[:k]]  # best first, then lower id
    placed = hit_lists >= 0
    uniq, inverse = np.unique(hit_lists[placed], return_inverse=True)
    best = np.zeros(len(uniq), dtype=np.float32)
    np.maximum.at(best, inverse, scores[hit[placed]])
    return LexicalAnswer(ids[top], scores[top].astype(np.float32), uniq.astype(np.int64), best, of_ids)


def local_search_with_bm25(part: ClusteredIndex, postings: Postings) -> ShardSearch:
    """A shard's search in this process (tests, one machine) that, given the question's weights,
    brings what a replica's brings (app.shards.replicas): the found chunks' BM25 scores and its best
    per list."""

    def search(
        q: Floats, k: int, lists: Ints, at_least: int | None = None, bm25: object | None = None
    ) -> Future[Answer]:
        scores, ids = part.search(q, k, lists)  # [Q, k]
        done: Future[Answer] = Future()
        if not isinstance(bm25, QueryWeights):
            done.set_result((scores, ids))
            return done
        a = answer_from(postings.scores(bm25), postings.ids, part.clusters_of, 1, None, ids.ravel())
        done.set_result((scores, ids, 0, 0, a.of_ids.reshape(ids.shape), a.lists, a.best))
        return done

    return search


def local_lexical(postings: Postings, index: SearchIndex) -> LexicalShard:
    """A shard's BM25 in this process (tests, one machine): its answer, as a done future."""

    def ask(w: QueryWeights, k: int, lists: Ints | None, ids: Ints | None) -> PendingLexical:
        done: Future[LexicalAnswer] = Future()
        done.set_result(answer_from(postings.scores(w), postings.ids, index.clusters_of, k, lists, ids))
        return done

    return ask
