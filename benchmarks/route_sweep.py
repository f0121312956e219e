"""The served pipeline's routing knobs swept on the dev questions, over a store `routing.py` built.

    python benchmarks/route_sweep.py --data-dir /var/tmp/eval/data \
        --grid '{"expert_verify_lexical_slack": [0, 0.06], "expert_nprobe": [16, 32]}'

Every combination of the grid's `PipelineConfig` fields (the others stay at their defaults)
answers every question through `AskPipeline.prepare`, with the active router and the domain
experts of `routing.setup_experts`. One JSON line per combination: routed hit@10 and MRR@10,
the share of questions on the expert path, the share of those sent to the right domain, and
the vectors the expert path scanned on average, and each metric's paired difference from the
first combination with a 95% bootstrap interval. Tune on dev only; the held-back questions judge.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.evalcorpus import load_questions
from benchmarks.retrieval_metrics import first_hits, metrics_for, paired_difference
from benchmarks.routing import served, setup_experts
from benchmarks.routing_report import path_figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True, help="a store routing.py built (router trained)")
    ap.add_argument("--grid", required=True, help="JSON: PipelineConfig field -> list of values")
    ap.add_argument("--questions", type=Path, help="default: ../shared/eval/faq-dev.jsonl")
    ap.add_argument(
        "--codec", choices=["flat", "sq8"], default="flat", help="MOERAG_INDEX_CODEC (sq8 rebuilds the copy)"
    )
    ap.add_argument("--name", help="also write the rows to benchmarks/results/<name>.json")
    args = ap.parse_args()

    from app.core.settings import Settings
    from app.runtime import Runtime
    from engine.pipeline import PipelineConfig

    grid: dict[str, list[object]] = json.loads(args.grid)
    unknown = set(grid) - set(asdict(PipelineConfig()))
    if unknown:
        sys.exit(f"not PipelineConfig fields: {sorted(unknown)}")
    questions = load_questions(args.questions)
    # The question cache keeps each question's embedding across combinations; answers are not cached.
    rt = Runtime(Settings(data_dir=args.data_dir, question_cache=1024, answer_cache=0, index_codec=args.codec))
    rt.start()
    try:
        setup_experts(rt)  # one expert per domain, named for it
        served_config = rt.pipeline.config
        baseline: list[int | None] | None = None  # the first combination's ranks
        rows: list[dict[str, object]] = []
        for values in itertools.product(*grid.values()):
            combo = dict(zip(grid, values, strict=True))
            rt.pipeline.config = PipelineConfig(**{**asdict(served_config), **combo})
            ranked, preps = served(rt, questions)
            routes = [p.route for p in preps]
            share, right = path_figures(routes, questions)
            scanned = [r.vectors_scanned for r in routes if r.path == "expert"]
            m = metrics_for(ranked, questions)
            first = first_hits(ranked, questions)
            baseline = first if baseline is None else baseline
            row = {
                **combo,
                "hit@10": m["hit@10"],
                "mrr@10": m["mrr@10"],
                "expert_path_share": share,
                "right_on_path": right,
                "vectors_scanned": round(sum(scanned) / max(1, len(scanned))),
                "minus_first": {
                    k: paired_difference(first, baseline, k) for k in ("hit@1", "hit@5", "hit@10", "mrr@10")
                },
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
        rt.pipeline.config = served_config
        if args.name:
            out = {
                "command": "python benchmarks/route_sweep.py " + " ".join(sys.argv[1:]),
                "codec": args.codec,
                "questions": len(questions),
                "rows": rows,
            }
            (Path(__file__).resolve().parent / "results" / f"{args.name}.json").write_text(
                json.dumps(out, indent=2) + "\n"
            )
    finally:
        rt.close()


if __name__ == "__main__":
    main()
