"""Questions per second from the question model: eager PyTorch against the frozen TorchScript trace
and ONNX Runtime (with the `onnx` extra), one and two threads calling it at once, one and eight
questions a call (one torch / ONNX Runtime thread each).

    python benchmarks/question_model.py --seconds 4      # results: benchmarks/results/question-model.json
    python benchmarks/question_model.py --name question-model-f32   # another file, another machine

Why the serving path traces the model (`Embedder.trace_questions`): eager PyTorch holds the GIL
for most of a one-question forward pass (module calls, argument parsing between small ops), so a
second thread adds little; the trace runs the whole forward in C++ without it.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS = Path(__file__).resolve().parent / "results"


def rate(encode: Any, questions: list[str], threads: int, batch: int, seconds: float) -> float:
    """Questions embedded per second by `threads` threads each calling `encode` on `batch` questions."""
    counts = [0] * threads
    stop = time.perf_counter() + seconds

    def work(i: int) -> None:
        j = i * 7
        while time.perf_counter() < stop:
            start = j % (len(questions) - batch)
            encode(questions[start : start + batch])
            counts[i] += batch
            j += 13

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return round(sum(counts) / seconds, 1)


def main() -> None:
    import torch

    from benchmarks.evalcorpus import load_questions
    from engine.embedder import Embedder
    from engine.errors import NotConfigured

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--name", default="question-model", help="results file stem under benchmarks/results/")
    args = ap.parse_args()
    torch.set_num_threads(1)  # as a serving process runs (app.runtime.use_serving_threads)
    questions = [q["question"] for q in load_questions()]
    eager, traced, onnx = Embedder(), Embedder(), Embedder()
    trace = traced.trace_questions()
    models = [("eager", eager), ("traced", traced)]
    try:
        exported = onnx.onnx_questions()
    except NotConfigured as exc:
        exported = f"skipped ({exc})"
    if exported.startswith("onnxruntime"):
        models.append(("onnxruntime", onnx))
    rows = []
    for name, emb in models:
        emb.encode_questions(questions[:8])  # warm-up
        for threads in (1, 2):
            for batch in (1, 8):
                rows.append(
                    {
                        "model": name,
                        "threads": threads,
                        "batch": batch,
                        "questions_per_s": rate(emb.encode_questions, questions, threads, batch, args.seconds),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    result = {
        "command": "python benchmarks/question_model.py " + " ".join(sys.argv[1:]),
        "dtype": eager.dtype_name,
        "trace": trace,
        "onnxruntime": exported,
        "rows": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
