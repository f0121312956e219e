"""The central sample (engine.central_sample): chosen by id alone, searched exactly over its lists."""

from __future__ import annotations

import numpy as np

from engine.central_sample import SAMPLE_FLOOR, build_sample, sample_share, sampled
from engine.lexical import LexicalIndex
from index import ClusteredIndex


def test_the_sample_is_chosen_by_id_alone_at_the_share_asked() -> None:
    ids = np.arange(1, 200_001, dtype=np.int64)
    chosen = sampled(ids, 0.05)
    assert abs(chosen.mean() - 0.05) < 0.003  # the share asked
    assert np.array_equal(sampled(ids[::7], 0.05), chosen[::7])  # a chunk's fate does not depend on the others
    assert sampled(ids, 1.0).all()
    assert sample_share(SAMPLE_FLOOR, 0.05) == 1.0 and sample_share(100_000, 0.05) == 0.05
    assert sample_share(10_000, 0.05) == SAMPLE_FLOOR / 10_000 and sample_share(10_000, 0) == 0


def test_a_sample_index_searches_its_chunks_in_the_lists_the_index_gives_them() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((600, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    index = ClusteredIndex.create(x[:8].copy(), "v")
    ids = np.arange(600, dtype=np.int64)
    index.add(x, ids, index.assign(x))
    texts = [f"chunk {i} {'apple' if i % 3 == 0 else 'pear'}" for i in range(600)]
    lexical = LexicalIndex(ids.tolist(), texts)
    keep = np.flatnonzero(sampled(ids, 0.3))
    sample = build_sample(ids[keep], x[keep], [texts[i] for i in keep], lexical.stats, 0.3)
    view = sample.over(index)
    q = x[:2] + 0.01  # [2, 16]
    lists = [1, 4, 6]
    _, found = view.search(q, 5, lists)  # [2, 5]
    inside = keep[np.isin(index.clusters_of(keep), lists)]
    for row in range(2):
        want = inside[np.argsort(-(x[inside] @ q[row]), kind="stable")[:5]]
        assert np.array_equal(found[row], want)
    assert view.scan_size(lists) == (3, len(inside))
    _, i_near, scanned = view.search_nearest(q[:1], 4, 2)
    near = index.nearest_lists(q[0], np.arange(8), 2)
    assert set(index.clusters_of(i_near[0][i_near[0] >= 0]).tolist()) <= set(near.tolist()) and scanned > 0
    # BM25 over the sample scores as the whole store does (its statistics), on the sampled chunks only
    terms = sample.terms("apple")
    assert terms is not None
    best = terms.search(3)
    whole = dict(lexical.search("apple", 600))
    assert all(i in set(keep.tolist()) and abs(s - whole[i]) < 1e-5 for i, s in best)
    # A chunk gone from the index (list -1) is never found
    index.remove([int(found[0][0])])
    assert int(found[0][0]) not in view.search(q, 5, lists)[1][0].tolist()
