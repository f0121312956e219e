"""Retrieval metrics over the evaluation's questions (section 5 of ../shared/eval/corpus.md):
first-hit ranks, hit@k and MRR@10, paired differences with bootstrap intervals."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.evalcorpus import domain_of, is_hit


def first_hits(
    ranked: list[list[tuple[str, str]]], questions: list[dict[str, str]], depth: int = 10
) -> list[int | None]:
    """Per question, the rank (1-depth) of the first hit, or None."""
    return [
        next((r for r, (text, src) in enumerate(chunks[:depth], 1) if is_hit(text, src, q)), None)
        for q, chunks in zip(questions, ranked, strict=True)
    ]


def per_question(first: list[int | None], metric: str = "hit@10") -> np.ndarray:
    """[Q] each question's share of a metric: 1/0 for hit@k, the reciprocal rank for mrr@10."""
    if metric == "mrr@10":
        return np.array([1 / r if r is not None else 0.0 for r in first], dtype=float)
    k = int(metric.removeprefix("hit@"))
    return np.array([r is not None and r <= k for r in first], dtype=float)


def paired_difference(
    a: list[int | None], b: list[int | None], metric: str = "hit@10", rounds: int = 2000
) -> dict[str, float]:
    """metric (hit@k or mrr@10) of a minus that of b over the same questions, with a 95% paired
    bootstrap interval; a_only / b_only count the questions where each is ahead."""
    x = per_question(a, metric) - per_question(b, metric)  # [Q] per-question difference
    rng = np.random.default_rng(0)
    means = x[rng.integers(0, len(x), (rounds, len(x)))].mean(1)  # [rounds]
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {
        "diff": round(float(x.mean()), 3),
        "ci95": [round(float(lo), 3), round(float(hi), 3)],
        "a_only": int((x > 0).sum()),
        "b_only": int((x < 0).sum()),
    }


def metrics_for(ranked: list[list[tuple[str, str]]], questions: list[dict[str, str]]) -> dict[str, float]:
    """ranked[i] = [(chunk text, source)] best first, for question i."""
    out = {"hit@1": 0.0, "hit@5": 0.0, "hit@10": 0.0, "mrr@10": 0.0, "top1_domain": 0.0}
    for q, chunks, first in zip(questions, ranked, first_hits(ranked, questions), strict=True):
        out["top1_domain"] += bool(chunks) and domain_of(chunks[0][1]) == q["domain"]
        if first is not None:
            out["mrr@10"] += 1 / first
            for k in (1, 5, 10):
                out[f"hit@{k}"] += first <= k
    return {k: round(v / len(questions), 3) for k, v in out.items()}
