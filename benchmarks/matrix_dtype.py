"""The scoped kernel's vector copy stored in float16 or bfloat16 against float32, on the evaluation
store, in one run: what halving the bytes a GPU search reads does to the answers.

    python benchmarks/matrix_dtype.py --data-dir D    # results: benchmarks/results/matrix-dtype.json

The store is opened with `MOERAG_SCOPED_SEARCH=kernel` (the expert path searches the expert-sorted
matrix with the scoped search, here its torch twin on the CPU: the kernel's oracle, the same rows)
and each `MOERAG_MATRIX_DTYPE` in turn; the 174 FAQ dev questions are asked through the served
pipeline (mode auto, k=10). Per dtype: FAQ dev hit@10, and on the questions the expert path
answered, the share of float32's top 10 chunks among its top 10 (`top10_agreement`) and the
questions whose citations changed at all. Tune nothing on this: it is a check.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS = Path(__file__).resolve().parent / "results"


def ask(data_dir: Path, dtype: str, questions: list[dict[str, str]]) -> list[tuple[str, list[int], bool]]:
    """(route path, cited chunk ids, hit) per question."""
    from app.core.settings import Settings
    from app.runtime import Runtime
    from benchmarks.retrieval_metrics import first_hits
    from benchmarks.routing import served

    settings = Settings(data_dir=data_dir, scoped_search="kernel", matrix_dtype=dtype, question_cache=0, answer_cache=0)
    rt = Runtime(settings)
    rt.start(run_jobs=False)
    try:
        assert rt.state().matrix is not None and str(rt.state().matrix.x.dtype) == f"torch.{dtype}"
        ranked, preps = served(rt, questions)  # mode auto, k=10, as served
        hits = first_hits(ranked, questions)
        return [
            (p.route.path, [c.chunk.id for c in p.citations], h is not None) for p, h in zip(preps, hits, strict=True)
        ]
    finally:
        rt.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True, help="a copy of the evaluation store")
    ap.add_argument("--name", default="matrix-dtype")
    args = ap.parse_args()
    from benchmarks.evalcorpus import load_questions

    questions = load_questions()
    runs = {dt: ask(args.data_dir, dt, questions) for dt in ("float32", "float16", "bfloat16")}
    base = runs["float32"]
    result: dict[str, Any] = {"command": "python benchmarks/matrix_dtype.py " + " ".join(sys.argv[1:]),
                              "questions": len(questions)}  # fmt: skip
    for dt, answers in runs.items():
        routed = [n for n, (path, _, _) in enumerate(base) if path == "expert" and answers[n][0] == "expert"]
        agree = [len(set(answers[n][1]) & set(base[n][1])) / max(len(base[n][1]), 1) for n in routed]
        result[dt] = {
            "hit@10": round(sum(h for _, _, h in answers) / len(answers), 3),
            "expert_path": sum(path == "expert" for path, _, _ in answers),
            "top10_agreement_on_the_expert_path": round(sum(agree) / max(len(agree), 1), 4),
            "questions_whose_citations_changed": sum(answers[n][1] != base[n][1] for n in range(len(base))),
        }
        print(dt, json.dumps(result[dt]), flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
