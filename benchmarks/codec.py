"""The index's codec on the evaluation store: FAQ dev hit@10 routed and on the fallback (global
hybrid), the index's bytes and the time a question takes, flat against sq8, in one run.

    python benchmarks/codec.py --data-dir D    # results: benchmarks/results/codec.json

The store is opened once with each `MOERAG_INDEX_CODEC` (an sq8 opening rebuilds the index from
SQL's float32 embeddings: the answer scores then come from the codes), and the 174 dev questions
are asked through the served pipeline (k=10), each way in turn, twice; the second pass is timed.
`recall@10` is the sq8 index's top 10 for each dev question's embedding, every list searched,
against the float32 index's (exact: every list of IVF-Flat is a flat search).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import write_result

RESULTS = Path(__file__).resolve().parent / "results"


def measure(data_dir: Path, codec: str, questions: list[dict[str, str]]) -> dict[str, Any]:
    from app.core.settings import Settings
    from app.runtime import Runtime
    from benchmarks.evalcorpus import is_hit
    from engine.pipeline import AskRequest

    rt = Runtime(Settings(data_dir=data_dir, index_codec=codec, question_cache=0, answer_cache=0))
    rt.start(run_jobs=False)
    try:
        index = rt.indexes.index
        out: dict[str, Any] = {"index_status": rt.index_status.split(":")[0], "index_bytes": len(index.to_bytes())}
        out["top10"] = index.search(rt.embedder.encode([q["question"] for q in questions]), 10)[1].tolist()
        for mode in ("auto", "fallback"):
            hits, ms = 0, []
            for rounds in range(2):
                for q in questions:
                    t = time.perf_counter()
                    p = rt.pipeline.prepare(AskRequest(q["question"], top_k=10, mode=mode))
                    if rounds:
                        ms.append((time.perf_counter() - t) * 1000)
                        hits += any(is_hit(c.chunk.text, c.chunk.source, q) for c in p.citations)
            out[mode] = {"hit@10": round(hits / len(questions), 3), "ms_p50": round(statistics.median(ms), 2)}
    finally:
        rt.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True, help="a copy of the evaluation store (it is rewritten)")
    ap.add_argument("--name", default="codec")
    args = ap.parse_args()
    from benchmarks.evalcorpus import load_questions

    questions = load_questions()
    result: dict[str, Any] = {
        "command": "python benchmarks/codec.py " + " ".join(sys.argv[1:]),
        "questions": len(questions),
    }
    for codec in ("flat", "sq8"):
        result[codec] = measure(args.data_dir, codec, questions)
        print(codec, json.dumps({k: v for k, v in result[codec].items() if k != "top10"}), flush=True)
    exact, coded = result["flat"].pop("top10"), result["sq8"].pop("top10")
    overlap = [len(set(a) & set(b)) / 10 for a, b in zip(exact, coded, strict=True)]
    result["sq8"]["recall@10"] = round(sum(overlap) / len(overlap), 4)
    RESULTS.mkdir(exist_ok=True)
    write_result(RESULTS / f"{args.name}.json", result)


if __name__ == "__main__":
    main()
