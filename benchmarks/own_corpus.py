"""A team's own corpus on top of the sample store, before and after one re-fit.

The pydoc sample store (built here, as `moerag serve --sample` builds it), then the twelve
documents of tests/data/own_topics (sourdough baking, Kubernetes networking, beekeeping: topics
the sample never saw). Each of their nine questions and six questions on the sample's own modules is asked
before and after `Refit.apply` (the one re-fit action), with its route; the drift report and the
re-fit's plan are recorded too.

    python benchmarks/own_corpus.py [--work /var/tmp/own-corpus]

Results: benchmarks/results/own-corpus.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent
OWN = ROOT / "tests" / "data" / "own_topics"
RESULTS = Path(__file__).resolve().parent / "results"
SAMPLE_QUESTIONS = [
    "How do I parse JSON in Python?",
    "What does itertools.chain do?",
    "How do I create a temporary directory?",
    "How do I compute a SHA-256 hash?",
    "How do I read a CSV file?",
    "How do I format a date with strftime?",
]


def routes(rt: Any, questions: dict[str, list[str]]) -> dict[str, list[dict[str, Any]]]:
    from engine.pipeline import AskRequest

    out: dict[str, list[dict[str, Any]]] = {}
    for topic, qs in questions.items():
        for q in qs:
            r = rt.pipeline.prepare(AskRequest(q)).route
            out.setdefault(topic, []).append(
                {
                    "question": q,
                    "path": r.path,
                    "reason": r.reason,
                    "expert": r.expert.name if r.path == "expert" and r.expert else None,
                    "confidence": None if r.confidence is None else round(r.confidence, 3),
                }
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/own-corpus"))
    args = ap.parse_args()

    from app.cli.main import ingest_files
    from app.cli.sample import ensure_sample
    from app.core.settings import Settings
    from app.runtime import Runtime
    from app.services.content_fit import ContentFit
    from app.services.refit import Refit

    shutil.rmtree(args.work, ignore_errors=True)
    settings = Settings(data_dir=args.work, question_cache=0, answer_cache=0)
    t0 = time.perf_counter()
    ensure_sample(settings)
    result: dict[str, Any] = {"sample_seconds": round(time.perf_counter() - t0, 1)}
    questions = {"sample": SAMPLE_QUESTIONS, **json.loads((OWN / "questions.json").read_text())}
    rt = Runtime(settings)
    rt.start(run_jobs=False)
    try:
        result["ingest"] = ingest_files(rt, sorted(OWN.glob("*.md")), progress=False)
        rt.catalogue.sync()
        result["before"] = routes(rt, questions)
        stale = rt.routers.staleness()
        result["drift"] = {k: stale["drift"][k] for k in ("documents", "chunks", "summary")}
        refit = Refit(
            rt.indexes, rt.routers, ContentFit(rt.sessions, rt.indexes, lambda: rt.catalogue.version).new_topics
        )
        result["plan"] = refit.plan()
        t0 = time.perf_counter()
        applied = refit.apply()
        rt.catalogue.sync()
        result["refit_seconds"] = round(time.perf_counter() - t0, 1)
        result["applied"] = {k: applied[k] for k in ("clusters", "experts", "emptied_experts", "router")}
        result["after"] = routes(rt, questions)
        result["drift_after"] = rt.routers.staleness()["drift"]["summary"]
    finally:
        rt.close()
    result["command"] = " ".join(["python", *sys.argv])
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "own-corpus.json").write_text(json.dumps(result, indent=2))
    for when in ("before", "after"):
        for topic, found in result[when].items():
            for r in found:
                print(f"{when:6s} {topic:10s} {r['path']:8s} {r['reason']:22s} {r['confidence']} {r['expert']}")
    print(result["drift"]["summary"], "| after:", result["drift_after"])


if __name__ == "__main__":
    main()
