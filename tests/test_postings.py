"""BM25 split across shards with global statistics (engine.postings) against the whole index (bm25s)."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.lexical import LexicalIndex, TermStats
from engine.postings import Postings
from tests.helpers import TOPICS, topic_doc


def _chunks() -> list[str]:
    paragraphs = [p for t in TOPICS for i in range(12) for p in topic_doc(t, i, paragraphs=4).split("\n\n")]
    return [*paragraphs, "", "the and of", "Repeat repeat repeat git git"]  # no tokens, stopwords only, repeats


def test_shards_scored_with_global_statistics_give_the_whole_indexs_scores_bit_for_bit() -> None:
    texts = _chunks()
    ids = list(range(100, 100 + len(texts)))
    whole = LexicalIndex(ids, texts)
    stats = TermStats.of(texts)
    parts = [np.arange(len(texts))[s::3] for s in range(3)]  # three shards, interleaved
    shards = [Postings([ids[r] for r in rows], [texts[r] for r in rows]) for rows in parts]
    questions = [*(" ".join(t.split()[:9]) for t in texts[::7]), "git git rebase", "sqlite the", "zzz unknown"]
    compared = 0
    for question in questions:
        want = whole.scores(question)
        w = stats.weights(question)
        if w is None:
            assert want is None or not want.any()
            continue
        got = np.zeros(len(texts), dtype=np.float32)
        for rows, shard in zip(parts, shards, strict=True):
            got[rows] = shard.scores(w)
        assert want is not None and np.array_equal(got, want), question
        compared += int(want.any())
    assert compared > 20


def test_a_shards_own_statistics_would_rank_on_another_scale() -> None:
    """Why the statistics are global: scored with one shard's figures the same chunk scores otherwise."""
    texts = _chunks()
    stats, first = TermStats.of(texts), TermStats.of(texts[::3])
    shard = Postings(list(range(len(texts[::3]))), texts[::3])
    w_global, w_local = stats.weights("git branch merge"), first.weights("git branch merge")
    assert w_global is not None and w_local is not None
    assert not np.array_equal(shard.scores(w_global), shard.scores(w_local))


def test_a_questions_bm25_over_shards_asks_each_shard_once_then_only_the_candidates_shards() -> None:
    """`ShardedTerms`: one summary ask a shard (the whole store's best chunks and each list's best
    come from it), the candidates' scores asked only of the shards holding their lists (every
    shard for a chunk of no list yet), and a shard that fails is named, never an error."""
    from engine.sharded_lexical import ShardedLexical, local_lexical
    from index import ClusteredIndex
    from index.shards import ShardedIndex, carve, local_search, shard_failures

    texts = _chunks()
    ids = np.arange(len(texts), dtype=np.int64)
    lists_of_chunk = ids % 4  # 4 lists: 0-1 on shard 0, 2-3 on shard 1
    centroids = np.eye(4, dtype=np.float32)
    whole = ClusteredIndex.create(centroids, "v")
    whole.add(centroids[lists_of_chunk], ids, lists_of_chunk)
    shard_lists = [np.array([0, 1]), np.array([2, 3])]
    parts = [carve(whole, ls) for ls in shard_lists]
    sharded = ShardedIndex(whole, shard_lists, [local_search(p) for p in parts], names=["a", "b"])
    asked: list[tuple[int, int, Any, Any]] = []
    down = {"b": False}

    def recorded(n: int, part: ClusteredIndex) -> Any:
        held = part.assignments()[0]
        ask = local_lexical(Postings(held.tolist(), [texts[i] for i in held]), part)

        def call(w: Any, k: int, lists: Any, asked_ids: Any) -> Any:
            asked.append((n, k, lists, asked_ids))
            if n == 1 and down["b"]:
                raise TimeoutError("shard b did not answer")
            return ask(w, k, lists, asked_ids)

        return call

    stats, reference = TermStats.of(texts), LexicalIndex(ids.tolist(), texts)
    lexical = ShardedLexical(stats, [recorded(n, p) for n, p in enumerate(parts)], ["a", "b"], sharded)
    question = "git branch commit sqlite"
    terms = lexical.terms(question)
    assert terms is not None and lexical.terms("zzz unknown") is None
    whole_query = reference.query(question)
    assert terms.search(5) == whole_query.search(5)
    assert terms.best() == whole_query.best() and terms.best([2]) == whole_query.best(lists_of_chunk == 2)
    assert len(asked) == 2  # one summary a shard, both read from it
    on_a = [i for i in ids.tolist() if lists_of_chunk[i] < 2][:6]
    assert np.array_equal(terms.scores_of(on_a), whole_query.scores_of(on_a))
    assert [n for n, *_ in asked[2:]] == [0]  # the candidates' shard alone
    assert terms.search(3, [3]) == whole_query.search(3, lists_of_chunk == 3)  # scoped: asked again, of b
    assert asked[-1][0] == 1 and asked[-1][2].tolist() == [3]
    down["b"] = True
    with shard_failures() as failed:
        late = lexical.terms(question)
        assert late is not None and late.best() > 0  # shard a's answer
    assert failed == ["b"]
