"""BM25 split across shards, scored as one index would score it: postings per shard, statistics global.

BM25's score of a chunk for a question depends on the whole store through three figures: the
number of chunks, their mean length and each term's document frequency. A shard that scored its
own chunks with its own figures would rank them on another scale than its neighbours, and a merge
of their top-k would not be the whole store's. So the statistics are global (`TermStats`, built
over every chunk, a vocabulary's worth of memory: no postings) and travel with the question as its
term weights (`QueryWeights`); a shard keeps only its chunks' postings (`Postings`) and scores them
with those weights. The arithmetic is bm25s's "lucene" BM25 step for step (k1 1.5, b 0.75; idf
ln(1 + (N - df + 0.5) / (df + 0.5)) in float32; each term's contribution idf x tf / (tf + k1 (1 - b
+ b dl / avgdl)) stored as float32; a question's terms summed in float32 in its token order,
repeats included), so shards merged give `LexicalIndex`'s scores (tests/test_postings.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from engine.lexical import K1, B, QueryWeights, chunk_tokens

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float32]


class Postings:
    """One shard's BM25 postings (immutable; rebuilt when its chunks change): for each term, the
    chunks holding it and how often, and each chunk's length."""

    def __init__(self, ids: Sequence[int], texts: Sequence[str]) -> None:
        self.ids = np.asarray(ids, dtype=np.int64)  # [N]
        self.rows: dict[str, npt.NDArray[np.int32]] = {}  # term -> [n_t] rows holding it, ascending
        self.tf: dict[str, Floats] = {}  # term -> [n_t] its count in each
        lengths = np.zeros(len(self.ids), dtype=np.int32)  # [N]
        rows: dict[str, list[int]] = {}
        tf: dict[str, list[int]] = {}
        for row, text in enumerate(texts):
            tokens = chunk_tokens(text)
            lengths[row] = len(tokens)
            for term, count in Counter(tokens).items():
                rows.setdefault(term, []).append(row)
                tf.setdefault(term, []).append(count)
        self.lengths = lengths
        for term, r in rows.items():
            self.rows[term] = np.asarray(r, dtype=np.int32)  # 8 bytes a posting with its tf, as bm25s
            self.tf[term] = np.asarray(tf[term], dtype=np.float32)

    def __len__(self) -> int:
        return len(self.ids)

    def scores(self, w: QueryWeights) -> Floats:
        """[N] every chunk's BM25 score for the question (0 where it shares no term)."""
        out = np.zeros(len(self.ids), dtype=np.float32)  # [N]
        for term, idf in zip(w.terms, w.idf, strict=True):
            rows = self.rows.get(term)
            if rows is None:
                continue
            tf = self.tf[term]  # [n_t]
            # bm25s's expression and types: the length part in float64, tf float32 promoted.
            norm = K1 * ((1 - B) + B * self.lengths[rows] / np.float64(w.avgdl))  # [n_t]
            contribution = (np.float32(idf) * (tf / (norm + tf))).astype(np.float32)  # [n_t]
            out[rows] += contribution
        return out
