"""What a question's path costs around the model, each change against what it replaced, paired.

    python benchmarks/question_path.py --rounds 6    # results: benchmarks/results/question-path.json

The question model compiled as the server compiles it (`MOERAG_QUESTION_RUNTIME=auto`, with the
session that runs a lone question on every core), one question at a time. Two pairs:

- the input path (one thread): `encode_questions`, which feeds ONNX Runtime from the model's
  Rust tokenizer and pools in NumPy (`engine.onnx_questions`), against the same session fed by
  sentence-transformers' input module and pooled by its torch modules, as it was;
- a lone question (every core): embedded in the caller's thread, as `QuestionEncoder.submit`
  runs it, against the same call queued to a batch thread and waited for, as it was.

Each pair embeds each question back to back (the order alternating by round), so the shared
machine's drift falls on both; `paired_difference_p50_ms` is the median of the per-question
differences (before minus now).
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


def paired(ways: dict[str, Callable[[str], Any]], questions: list[str], rounds: int) -> dict[str, Any]:
    """{way: p50 and mean ms} and the median per-question difference, the second way minus the first."""
    ms: dict[str, list[float]] = {name: [] for name in ways}
    names = list(ways)
    for q in questions[:5]:  # warm-up
        for call in ways.values():
            call(q)
    for r in range(rounds):
        for q in questions:
            for name in names if r % 2 == 0 else names[::-1]:
                t = time.perf_counter()
                ways[name](q)
                ms[name].append((time.perf_counter() - t) * 1000)
    now, before = (ms[n] for n in names)
    out: dict[str, Any] = {
        n: {"p50_ms": round(statistics.median(v), 2), "mean_ms": round(statistics.mean(v), 2)} for n, v in ms.items()
    }
    out["paired_difference_p50_ms"] = round(statistics.median(b - a for a, b in zip(now, before, strict=True)), 2)
    return out


def main() -> None:
    import torch

    from benchmarks.evalcorpus import load_questions
    from engine.embedder import Embedder
    from engine.question_encoder import QuestionEncoder

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--questions", type=int, default=150, help="per round and way")
    ap.add_argument("--name", default="question-path", help="results file stem under benchmarks/results/")
    args = ap.parse_args()
    torch.set_num_threads(1)  # as a serving process runs (app.runtime.use_serving_threads)
    questions = [q["question"] for q in load_questions()][: args.questions]
    emb = Embedder()
    runtime = emb.compile_questions("auto", wide_threads=os.cpu_count() or 1)
    model = emb._question_model
    wide = partial(emb.encode_questions, wide=True)
    # Every call through the batch thread: the wide model as its only model, never run inline.
    queued = QuestionEncoder(wide, max_batch=16, cache_size=0, workers=os.cpu_count() or 1)
    result = {
        "command": "python benchmarks/question_path.py " + " ".join(sys.argv[1:]),
        "question_model": runtime,
        "cpus": os.cpu_count(),
        "calls_per_way": len(questions) * args.rounds,
        "input path, one thread": paired(
            {
                "NumPy: Rust tokenizer, NumPy pooling": lambda q: emb.encode_questions([q]),
                "input module, torch pooling": lambda q: emb._forward([q], model),
            },
            questions,
            args.rounds,
        ),
        "a lone question, every core": paired(
            {
                "in the caller's thread": lambda q: wide([q]),
                "through a batch thread": lambda q: queued.submit(q).result(),
            },
            questions,
            args.rounds,
        ),
    }
    queued.close()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
