"""Topics of documents, and short names for them (class-based TF-IDF, as BERTopic names topics).

New content is grouped at the document level: a document belongs to one topic. A document's
vector is the normalised mean of its chunks' unit vectors. Topics are the clusters of an
average-linkage agglomeration over cosine distance (scipy), cut where the documents of two
groups are on average less alike than TOPIC_JOIN, or cut into `n` topics when a count is asked
for. A topic of fewer than MIN_TOPIC_DOCUMENTS documents is too small to stand alone: its
documents come back unassigned (-1), to be answered by the fallback until more arrive.

Measured on MiniLM (all-MiniLM-L6-v2) document vectors: documents of one topic are 0.39-0.80
alike, documents of two different topics 0.30 at most and 0.07-0.23 on average; the pydoc
sample's modules are at most 0.23 alike to any of them (docs/decisions/expert-ownership.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from scipy.cluster.hierarchy import fcluster, linkage
from sklearn.feature_extraction.text import CountVectorizer

Floats = npt.NDArray[np.float32]
Ints = npt.NDArray[np.int64]

TOPIC_JOIN = 0.35  # two groups of documents are one topic when their average cosine is at least this
MIN_TOPIC_DOCUMENTS = 3  # a topic with fewer documents stays unassigned (the fallback answers it)
MAX_NAME = 40  # characters in a topic's name
NAME_WORDS = (2, 3)  # a name's words: at least two where the topic has them, at most three
TITLE_WEIGHT, HEADING_WEIGHT = 3, 2  # a title's words count thrice, a heading's twice, the text's once


def document_vectors(x: Floats, documents: Ints) -> tuple[Ints, Floats]:
    """x [N, D] unit chunk vectors with their document [N] -> (document ids [M], [M, D] unit means)."""
    ids, inverse = np.unique(documents, return_inverse=True)
    sums = np.zeros((len(ids), x.shape[1]), dtype=np.float64)  # [M, D]
    np.add.at(sums, inverse.reshape(-1), x)
    norms = np.linalg.norm(sums, axis=1, keepdims=True)
    return ids.astype(np.int64), (sums / np.maximum(norms, 1e-12)).astype(np.float32)


def topics(vectors: Floats, n: int = 0, *, join: float = TOPIC_JOIN, min_size: int = MIN_TOPIC_DOCUMENTS) -> Ints:
    """[M, D] unit document vectors -> [M] topic of each (0.. in order of first document; -1: none).

    n = 0: topics are cut where groups are on average less than `join` alike; n > 0: into n
    topics (fewer when there are fewer documents). Topics under `min_size` documents are -1.
    """
    m = len(vectors)
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    if m == 1:
        raw = np.ones(1, dtype=np.int64)
    else:
        tree = linkage(np.asarray(vectors, dtype=np.float64), method="average", metric="cosine")
        if n > 0:
            raw = fcluster(tree, min(n, m), criterion="maxclust").astype(np.int64)
        else:
            raw = fcluster(tree, 1.0 - join, criterion="distance").astype(np.int64)
    labels, counts = np.unique(raw, return_counts=True)
    big = {int(label) for label, c in zip(labels, counts, strict=True) if c >= min_size}
    out = np.full(m, -1, dtype=np.int64)
    order: dict[int, int] = {}
    for i, label in enumerate(raw.tolist()):
        if label in big:
            out[i] = order.setdefault(label, len(order))
    return out


def _words(title: str, headings: Sequence[str], text: str) -> str:
    """One document's text as naming reads it: title and headings weighed above the body."""
    return " ".join([*([title] * TITLE_WEIGHT), *(h for h in headings for _ in range(HEADING_WEIGHT)), text])


def topic_names(
    documents: Sequence[tuple[str, Sequence[str], str]],
    classes: Sequence[int],
    named: Sequence[int],
    taken: Sequence[str] = (),
) -> dict[int, str]:
    """A short, unique name for each class in `named`.

    documents[i]: (title, headings, text); classes[i]: its class (topics to name, and the rest
    of the store as classes of its own, so a name says what sets a topic apart from it). A name
    is 2-3 of the class's highest c-TF-IDF words, title-cased, joined by " · ", at most MAX_NAME
    characters, never cut mid-word, and unlike `taken` and the other names.
    """
    keys = sorted(set(classes))
    row = {c: i for i, c in enumerate(keys)}
    texts = [""] * len(keys)
    for (title, headings, text), c in zip(documents, classes, strict=True):
        texts[row[c]] += " " + _words(title, headings, text)
    vectorizer = CountVectorizer(stop_words="english", token_pattern=r"(?u)\b[a-zA-Z][a-zA-Z]{2,}\b", lowercase=True)
    try:
        counts = np.asarray(vectorizer.fit_transform(texts).todense(), dtype=np.float64)  # [K, V]
    except ValueError:  # only stop words
        counts = np.zeros((len(keys), 0))
    vocab = vectorizer.get_feature_names_out() if counts.shape[1] else np.array([], dtype=str)
    tf = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1.0)  # [K, V]
    idf = np.log1p(counts.sum() / max(len(keys), 1) / np.maximum(counts.sum(axis=0), 1.0))  # [V]
    scores = tf * idf  # [K, V]
    used = {t.casefold() for t in taken}
    out: dict[int, str] = {}
    for c in named:
        ranked = [str(vocab[i]) for i in np.argsort(-scores[row[c]], kind="stable") if scores[row[c], i] > 0]
        out[c] = _unique(ranked, used)
        used.add(out[c].casefold())
    return out


def _join(words: Sequence[str]) -> str:
    return " · ".join(w.capitalize() for w in words)


def _unique(ranked: list[str], used: set[str]) -> str:
    """Up to NAME_WORDS[1] of the `ranked` words that fit MAX_NAME; when that name is `used`, the
    first two with another word, else a number."""
    words: list[str] = []
    for word in ranked:
        if len(words) < NAME_WORDS[1] and len(_join([*words, word])) <= MAX_NAME:
            words.append(word)
    candidates = [_join(words)] + [_join([*words[:-1], w]) for w in ranked if w not in words]
    for name in candidates:
        if name and len(name) <= MAX_NAME and name.casefold() not in used:
            return name
    base = _join(words) or "Topic"
    while len(base) > MAX_NAME - 4 and " · " in base:  # room for a number, whole words only
        base = base.rsplit(" · ", 1)[0]
    if len(base) > MAX_NAME - 4:
        base = "Topic"
    return next(f"{base} {i}" for i in range(2, len(used) + 3) if f"{base} {i}".casefold() not in used)


def slug(name: str) -> str:
    """A name as a model id's tail: lower-case words joined by '-' ('Sourdough · Starter' -> 'sourdough-starter')."""
    return re.sub(r"[^a-z0-9]+", "-", name.casefold()).strip("-")[:64] or "expert"
