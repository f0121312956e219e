"""Query-like training samples drawn from chunks: a sentence, a heading, a heading as a question.

Questions are short and phrased unlike the passages that answer them; a router trained on
whole chunks alone is under-confident on real questions. These samples move the training
(and, above all, the calibration) data towards what users actually type.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_WORDS = re.compile(r"\w+")
_TEMPLATES = ("What is {}?", "How do I use {}?", "How does {} work?", "{}")
_GENERIC = {"introduction", "overview", "description", "synopsis", "notes", "see also", "examples", "name"}


@dataclass(frozen=True)
class Sample:
    text: str
    source: int  # index of the chunk it was drawn from
    kind: str = "sentence"  # or "heading": a heading, bare or in a question template


def _heading_tail(heading: str) -> str:
    tail = heading.rsplit(" > ", 1)[-1].strip()
    tail = re.sub(r"^[\d.]+\s+|^(Chapter|Section|Appendix)\s+[\w.]+\s*", "", tail).strip()
    return tail if tail.lower() not in _GENERIC and len(_WORDS.findall(tail)) >= 1 else ""


def query_like_samples(texts: Sequence[str], headings: Sequence[str], n: int, seed: int = 0) -> list[Sample]:
    """Up to n samples, each from a random chunk: mostly sentences, some headings and questions."""
    rng = random.Random(seed)
    if not texts:
        return []
    out: list[Sample] = []
    attempts = 0
    while len(out) < n and attempts < n * 4:
        attempts += 1
        i = rng.randrange(len(texts))
        roll = rng.random()
        tail = _heading_tail(headings[i]) if headings[i] else ""
        kind = "heading"
        if roll < 0.3 and tail:
            text = rng.choice(_TEMPLATES).format(tail)
        else:
            kind = "sentence"
            sentences = [s for s in _SENTENCE.split(texts[i]) if 5 <= len(_WORDS.findall(s)) <= 40]
            if not sentences:
                continue
            text = rng.choice(sentences).strip()
        out.append(Sample(text[:400], i, kind))
    return out


def held_out_documents(documents: Sequence[int], labels: Sequence[int], share: float, seed: int = 0) -> set[int]:
    """Whole documents held out for calibration, stratified by each document's majority label.

    A router calibrated on fragments of documents it trained on is over-confident on questions
    about documents it never saw; holding out documents measures (and calibrates) the latter.
    Every label keeps at least one training document.
    """
    votes: dict[int, dict[int, int]] = {}
    for doc, label in zip(documents, labels, strict=True):
        counts = votes.setdefault(doc, {})
        counts[label] = counts.get(label, 0) + 1
    by_label: dict[int, list[int]] = {}
    for doc in sorted(votes):
        majority = max(votes[doc].items(), key=lambda kv: (kv[1], -kv[0]))[0]
        by_label.setdefault(majority, []).append(doc)
    rng = random.Random(seed)
    held: set[int] = set()
    for _label, docs in sorted(by_label.items()):
        rng.shuffle(docs)
        n = min(round(share * len(docs)), len(docs) - 1)
        held.update(docs[:n])
    return held


def heading_queries(
    headings: Sequence[str], documents: Sequence[int], limit: int, seed: int = 0
) -> tuple[list[str], list[list[int]]]:
    """Questions made of headings, each with the chunks it heads: training pairs for the query adapter.

    One question per (document, heading): its last part in a question template ("How does {}
    work?"), or bare. Its positives are the positions of every chunk under that heading in that
    document. Generic headings (Synopsis, Examples, ...) and chunks without one give none. At
    most `limit` questions, a seeded sample when there are more.
    """
    groups: dict[tuple[int, str], list[int]] = {}
    for i, (heading, doc) in enumerate(zip(headings, documents, strict=True)):
        tail = _heading_tail(heading) if heading else ""
        if tail:
            groups.setdefault((doc, tail), []).append(i)
    rng = random.Random(seed)
    keys = sorted(groups)
    if len(keys) > limit:
        keys = sorted(rng.sample(keys, limit))
    return [rng.choice(_TEMPLATES).format(tail) for _, tail in keys], [groups[k] for k in keys]
