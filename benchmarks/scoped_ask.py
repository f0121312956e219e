"""What a scoped token costs a question: /ask's route and retrieval with a scope of about half the
store against no scope, in one run, on a store `routing.py` built (the evaluation corpus).

    python benchmarks/scoped_ask.py --data-dir DATA_DIR   # results: benchmarks/results/scoped-ask.json

The scope is two of the six domains (python, sqlite: half the chunks, by source prefix),
resolved as a token's scope is (app.services.tokens). Each FAQ dev question is asked through the
served path (`app.services.answering.prepare`: embedded, checked, routed, retrieved; no answer
generated, no answer cache) once with the scope and once without, in alternating order, for `--rounds`
rounds: p50 and p95 of each, the paths taken (expert paths to an expert the scope holds only part
of, unnamed, counted apart), their ratio, the scoped answers' share of chunks in the scope, and
each side's hit@k (evalcorpus's rule) on the questions of the scoped domains. `--by expert` scopes
the same domains by their experts instead (the experts' lists).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import percentile, write_result
from benchmarks.evalcorpus import RULES, is_hit, load_questions

RESULTS = Path(__file__).resolve().parent / "results"
SCOPED_DOMAINS = ("python", "sqlite")  # 50.1% of the evaluation store's chunks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--by",
        choices=["prefix", "expert"],
        default="prefix",
        help="the scope: the domains' documents by source prefix, or their experts' lists",
    )
    ap.add_argument("--name", default="scoped-ask")
    ap.add_argument(
        "--question-cache",
        type=int,
        default=0,
        help="MOERAG_QUESTION_CACHE: 0 (default) embeds every question anew, as new questions are; "
        "1024 keeps the embeddings, leaving route and retrieval alone in the figures",
    )
    args = ap.parse_args()

    from app.core.settings import Settings
    from app.runtime import Runtime
    from app.schemas.api import AskIn
    from app.services.answering import prepare
    from app.services.tokens import Principal, Scope

    rt = Runtime(Settings(data_dir=args.data_dir, answer_cache=0, question_cache=args.question_cache))
    rt.start(run_jobs=False)
    try:
        state = rt.state()
        if args.by == "expert":
            named = tuple(sorted(i for i, e in state.experts.items() if e.name in SCOPED_DOMAINS))
            who = Principal("read", Scope(experts=named), "half")
        else:
            prefixes = tuple(rule.root for rule in RULES if rule.domain in SCOPED_DOMAINS)
            who = Principal("read", Scope(source_prefixes=prefixes), "half")
        allowed = rt.tokens.allowed(who, state.version, state.experts, state.index)
        assert allowed is not None
        share = len(allowed.ids) / state.index.ntotal
        asked_set = load_questions()
        questions = [q["question"] for q in asked_set]
        for q in questions:  # a warm-up round (with a question cache: every question embedded once)
            prepare(rt, AskIn(query=q, generate=False))
        took: dict[str, list[float]] = {"whole": [], "scoped": []}
        paths: dict[str, Counter[str]] = {"whole": Counter(), "scoped": Counter()}
        inside: list[float] = []
        hits: dict[str, list[bool]] = {"whole": [], "scoped": []}  # questions of the scoped domains
        for r in range(args.rounds):
            for n, q in enumerate(questions):
                order = ("whole", "scoped") if (n + r) % 2 == 0 else ("scoped", "whole")
                for side in order:
                    t = time.perf_counter()
                    asked = prepare(rt, AskIn(query=q, generate=False), who if side == "scoped" else None)
                    took[side].append((time.perf_counter() - t) * 1000)
                    route = asked.prepared.route
                    paths[side][route.path if route.named else "expert, unnamed"] += 1
                    if asked_set[n]["domain"] in SCOPED_DOMAINS:
                        cited = asked.prepared.citations
                        hits[side].append(any(is_hit(c.chunk.text, c.chunk.source, asked_set[n]) for c in cited))
                    if side == "scoped":
                        ids = [c.chunk.id for c in asked.prepared.citations]
                        inside.append(float(allowed.contains(np.array(ids, dtype=np.int64)).mean()) if ids else 1.0)
        result: dict[str, Any] = {
            "command": "python benchmarks/scoped_ask.py --data-dir DATA_DIR"
            + f" --rounds {args.rounds} --by {args.by} --question-cache {args.question_cache} --name {args.name}",
            "questions": len(questions),
            "scope": {
                "by": args.by,
                "domains": list(SCOPED_DOMAINS),
                "chunks": len(allowed.ids),
                "share_of_store": round(share, 3),
                "experts_visible": sorted(state.experts[e].name for e in allowed.experts),
                "lists_holding_it": len(allowed.lists_in(state.index)),
            },
        }
        for side, values in took.items():
            values.sort()
            result[side] = {
                "asked": len(values),
                "p50_ms": round(statistics.median(values), 2),
                "p95_ms": round(percentile(values, 95), 2),
                "paths": dict(paths[side]),
                "hit_at_k_scoped_domains": round(sum(hits[side]) / max(1, len(hits[side])), 3),
            }
        result["scoped_p50_over_whole"] = round(result["scoped"]["p50_ms"] / result["whole"]["p50_ms"], 3)
        result["scoped_citations_in_scope"] = round(min(inside), 3)
    finally:
        rt.close()
    print(result)
    RESULTS.mkdir(exist_ok=True)
    write_result(RESULTS / f"{args.name}.json", result)


if __name__ == "__main__":
    main()
