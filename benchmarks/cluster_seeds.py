"""How much the clustering decides: one store reclustered with several k-means seeds, the router
retrained on each, every mode scored on the same questions.

    cp -a /var/tmp/eval/data /var/tmp/eval/seeds   # it reclusters in place: use a copy
    python benchmarks/cluster_seeds.py --data-dir /var/tmp/eval/seeds --seeds 20250601,1,2,3

Chunks, embeddings and questions stay the same; only `MOERAG_CLUSTER_SEED` changes, and with it
the lists, their experts (each list to the domain holding most of its chunks, documents
re-placed) and the router trained on them; the query adapter does not read the lists, so global
dense stays put. What differs between seeds is what one build's figures cannot tell from luck.
One JSON line per seed, then each figure's minimum, mean and maximum; all of it in
benchmarks/results/NAME.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.evalcorpus import load_questions
from benchmarks.routing import RESULTS, ROUTED, evaluate

MODES = {
    "routed": ROUTED,
    "global dense": "global dense (exact)",
    "global hybrid": "global hybrid (fallback path)",
    "oracle route": "oracle route (served expert path, true domain)",
}


# The trained version's own figures on its held-out documents (no question in them): what a
# build could choose among clusterings by, were any of them to follow the dev figures.
HELD_OUT = {
    "held-out accuracy": "accuracy",
    "held-out coverage at the threshold": "coverage_at_threshold",
    "held-out right on the path": "accuracy_at_threshold",
    "held-out ECE": "ece_after",
}


def seed_row(seed: int, result: dict[str, Any], trained: dict[str, Any] | None = None) -> dict[str, Any]:
    """One seed's figures from a `routing.evaluate` result, with the trained router version's
    held-out metrics (`RouterVersion.metrics`) when given."""
    row: dict[str, Any] = {"seed": seed}
    for short, name in MODES.items():
        row[f"{short} hit@10"] = result["retrieval"][name]["hit@10"]
        row[f"{short} MRR@10"] = result["retrieval"][name]["mrr@10"]
    router = result["router"]
    row |= {
        "on the expert path": router["expert_path_share"],
        "right there": router["expert_path_accuracy"],
        "router accuracy": router["accuracy"],
        "ECE": router["ece_after"],
        "vectors scanned": result["vectors_scanned"]["expert path share of global"],
        "FAQ-page chunks outside their expert": result["leakage"]["faq_page_chunks_outside"],
    }
    if trained is not None:
        row |= {short: round(float(trained[key]), 4) for short, key in HELD_OUT.items()}
    return row


def spread(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each figure's min, mean and max over the seeds."""
    keys = [k for k in rows[0] if k != "seed"]
    return {
        k: {
            "min": min(r[k] for r in rows),
            "mean": round(statistics.mean(r[k] for r in rows), 4),
            "max": max(r[k] for r in rows),
        }
        for k in keys
    }


def markdown(rows: list[dict[str, Any]], summary: dict[str, dict[str, float]]) -> str:
    keys = [k for k in rows[0] if k != "seed"]
    lines = ["| seed | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    lines += [f"| {r['seed']} | " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    lines.append("| min / mean / max | " + " | ".join(
        f"{summary[k]['min']} / {summary[k]['mean']} / {summary[k]['max']}" for k in keys) + " |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True, help="a copy of a store routing.py built")
    ap.add_argument("--seeds", default="20250601,1,2,3", help="k-means seeds, comma-separated")
    ap.add_argument("--questions", type=Path, help="default: ../shared/eval/faq-dev.jsonl")
    ap.add_argument("--name", default="cluster-seeds", help="results file stem under benchmarks/results/")
    args = ap.parse_args()

    from sqlalchemy import select

    from app.core.models import RouterVersion
    from app.core.settings import Settings
    from app.runtime import Runtime

    questions = load_questions(args.questions)
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        rt = Runtime(Settings(data_dir=args.data_dir, cluster_seed=seed, question_cache=0, answer_cache=0))
        rt.start()
        try:
            print(json.dumps({"seed": seed, "recluster": rt.indexes.recluster()}, default=str), flush=True)
            result = evaluate(rt, questions, train=True, latency_questions=0).result
            with rt.sessions() as session:
                trained = session.scalars(select(RouterVersion.metrics).where(RouterVersion.active)).first()
        finally:
            rt.close()
        rows.append(seed_row(seed, result, trained))
        print(json.dumps(rows[-1]), flush=True)
    summary = spread(rows)
    out = {"seeds": rows, "spread": summary, "questions": len(questions), "command": " ".join(["python", *sys.argv])}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(out, indent=2))
    (RESULTS / f"{args.name}.md").write_text(markdown(rows, summary) + "\n")
    print(markdown(rows, summary))


if __name__ == "__main__":
    main()
