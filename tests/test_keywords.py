import numpy as np

from engine.keywords import cluster_keywords


def test_keywords_are_distinctive_per_cluster() -> None:
    texts = ["sqlite database journal wal mode"] * 5 + ["git branch merge rebase commit"] * 5 + ["the of and"] * 2
    clusters = np.array([0] * 5 + [1] * 5 + [2] * 2)
    kw = cluster_keywords(texts, clusters, 4)
    assert {"sqlite", "journal"} <= set(kw[0]) and "git" not in kw[0]
    assert {"git", "rebase"} <= set(kw[1])
    assert kw[2] == [] and kw[3] == []
