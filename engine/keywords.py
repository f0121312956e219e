"""Distinctive keywords per cluster, c-TF-IDF style (a cluster's words weighed against all)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from scipy import sparse
from sklearn.feature_extraction.text import CountVectorizer


def cluster_keywords(
    texts: Sequence[str], clusters: npt.NDArray[np.int64], n_clusters: int, top: int = 8
) -> list[list[str]]:
    """texts [N] with their cluster [N] -> the `top` most distinctive words of each cluster."""
    if len(texts) == 0:
        return [[] for _ in range(n_clusters)]
    vectorizer = CountVectorizer(
        stop_words="english",
        token_pattern=r"(?u)\b[a-zA-Z][a-zA-Z0-9_]{2,}\b",
        lowercase=True,
        min_df=2 if len(texts) > 50 else 1,
        max_features=50_000,
    )
    try:
        counts = vectorizer.fit_transform(texts)  # [N, V]
    except ValueError:  # only stop words: no vocabulary
        return [[] for _ in range(n_clusters)]
    onehot = sparse.csr_matrix(
        (np.ones(len(texts)), (clusters, np.arange(len(texts)))), shape=(n_clusters, len(texts))
    )  # [C, N]
    per_cluster = np.asarray((onehot @ counts).todense(), dtype=np.float64)  # [C, V]
    tf = per_cluster / np.maximum(per_cluster.sum(axis=1, keepdims=True), 1.0)  # [C, V]
    avg_words = per_cluster.sum() / max(n_clusters, 1)
    idf = np.log1p(avg_words / np.maximum(per_cluster.sum(axis=0), 1.0))  # [V]
    scores = tf * idf  # [C, V]
    vocab = vectorizer.get_feature_names_out()
    result: list[list[str]] = []
    for row, total in zip(scores, per_cluster.sum(axis=1), strict=True):
        if total == 0:
            result.append([])
            continue
        best = np.argsort(-row, kind="stable")[:top]
        result.append([str(vocab[i]) for i in best if row[i] > 0])
    return result
