"""What a lone question pays to be embedded on a batch thread instead of its caller's.

    python benchmarks/lone_question.py --rounds 6    # results: benchmarks/results/lone-question.json

The question model compiled as the server compiles it (`MOERAG_QUESTION_RUNTIME=auto`, with the
session that runs a lone question on every core), one question at a time, in alternating rounds:

- `in the caller's thread`: `encode_questions([q], wide=True)`, as `QuestionEncoder.submit` now
  runs a lone question;
- `through a batch thread`: the same call queued to a `QuestionEncoder` batch thread and waited
  for, as it ran before (the queue, the thread's wake-up, the future's).

Both ways embed each question back to back (their order alternating by round), so the shared
machine's drift falls on both; `paired_difference_p50_ms` is the median of the per-question
differences: the hand-off's cost in every one-client answer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    import torch

    from benchmarks.evalcorpus import load_questions
    from engine.embedder import Embedder
    from engine.question_encoder import QuestionEncoder

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--questions", type=int, default=150, help="per round and way")
    ap.add_argument("--name", default="lone-question", help="results file stem under benchmarks/results/")
    args = ap.parse_args()
    torch.set_num_threads(1)  # as a serving process runs (app.runtime.use_serving_threads)
    questions = [q["question"] for q in load_questions()][: args.questions]
    emb = Embedder()
    runtime = emb.compile_questions("auto", wide_threads=os.cpu_count() or 1)
    wide = partial(emb.encode_questions, wide=True)
    # Every call through the batch thread: the wide model as its only model, never run inline.
    queued = QuestionEncoder(wide, max_batch=16, cache_size=0, workers=os.cpu_count() or 1)
    ways: dict[str, Callable[[str], Any]] = {
        "in the caller's thread": lambda q: wide([q]),
        "through a batch thread": lambda q: queued.submit(q).result(),
    }
    ms: dict[str, list[float]] = {name: [] for name in ways}
    names = list(ways)
    for q in questions[:5]:  # warm-up
        for call in ways.values():
            call(q)
    for r in range(args.rounds):
        for q in questions:  # both ways on each question, first one then the other: drift hits both
            for name in names if r % 2 == 0 else names[::-1]:
                t = time.perf_counter()
                ways[name](q)
                ms[name].append((time.perf_counter() - t) * 1000)
    queued.close()
    result = {
        "command": "python benchmarks/lone_question.py " + " ".join(sys.argv[1:]),
        "question_model": runtime,
        "cpus": os.cpu_count(),
        "calls_per_way": len(questions) * args.rounds,
        "paired_difference_p50_ms": round(statistics.median(b - a for a, b in zip(*ms.values(), strict=True)), 2),
        **{
            name: {"p50_ms": round(statistics.median(v), 2), "mean_ms": round(statistics.mean(v), 2)}
            for name, v in ms.items()
        },
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
