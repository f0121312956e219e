"""BM25 split across shards with global statistics (engine.postings) against the whole index (bm25s)."""

from __future__ import annotations

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
