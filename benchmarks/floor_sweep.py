"""Sweep the content-fit floor on a held-out-topic store (benchmarks/held_out_topic.py leaves one
per domain): each list's floor set to a quantile of the fits of the chunks it was clustered on
(the known domains' chunks), capped at 0.5 as index.fit caps it, then the held-out domain's and
the in-domain dev questions asked with the open-set check on. The floors are read by SQL at
question time, so no restart is needed between settings. The lowest member (quantile 0) is
index.fit's rule.

    python benchmarks/floor_sweep.py --store /var/tmp/eval/held/held-git --held git

Results: benchmarks/results/floor-sweep-<held>.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.evalcorpus import domain_of, load_questions
from benchmarks.held_out_topic import ask

RESULTS = Path(__file__).resolve().parent / "results"


def set_floors(rt: Any, held: str, quantile: float) -> dict[str, Any]:
    """Floors from the known domains' chunks; -> how many chunks and documents fall below, by side."""
    from sqlalchemy import select, update

    from app.core.models import Chunk, Cluster, Document
    from index.fit import FLOOR_CAP

    with rt.sessions.begin() as s:
        rows = s.execute(select(Chunk.cluster_id, Chunk.fit, Document.source, Chunk.document_id).join(Document)).all()
        lists = np.array([r[0] for r in rows])
        fit = np.array([r[1] for r in rows], dtype=np.float32)
        outside = np.array([domain_of(r[2]) == held for r in rows])
        docs = np.array([r[3] for r in rows])
        floor = np.full(lists.max() + 1, -1.0, dtype=np.float32)
        for c in range(len(floor)):
            members = fit[(lists == c) & ~outside]
            if len(members):
                floor[c] = min(float(np.quantile(members, quantile)), FLOOR_CAP)
        s.execute(update(Cluster), [{"id": c, "fit_floor": float(f)} for c, f in enumerate(floor)])
    below = fit < floor[lists]
    out: dict[str, Any] = {}
    for side, mask in (("held_out", outside), ("known", ~outside)):
        flagged = sum(2 * below[docs == d].sum() > (docs == d).sum() for d in np.unique(docs[mask]))
        out[side] = {"chunks_below": round(float(below[mask].mean()), 4), "documents_flagged": int(flagged)}
        out[side]["documents"] = len(np.unique(docs[mask]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--held", required=True)
    ap.add_argument("--quantiles", default="0,0.02,0.05,0.1")
    args = ap.parse_args()

    from app.core.settings import Settings
    from app.runtime import Runtime

    questions = load_questions()
    rt = Runtime(Settings(data_dir=args.store, question_cache=0, answer_cache=0))
    rt.start(run_jobs=False)
    try:
        result: dict[str, Any] = {"held": args.held, "sweep": {}}
        outside = [q for q in questions if q["domain"] == args.held]
        inside = [q for q in questions if q["domain"] != args.held]
        result["off"] = {"held_out": ask(rt, outside, False), "in_domain": ask(rt, inside, False)}
        for q in (float(x) for x in args.quantiles.split(",")):
            found = set_floors(rt, args.held, q)
            found |= {"held_out_questions": ask(rt, outside, True), "in_domain_questions": ask(rt, inside, True)}
            result["sweep"][str(q)] = found
            print(json.dumps({str(q): found}), flush=True)
    finally:
        rt.close()
    result["command"] = " ".join(["python", *sys.argv])
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"floor-sweep-{args.held}.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
