"""Query adapter variants, scored by exact dense search on a store routing.py built.

    python benchmarks/adapter_variants.py --data-dir /var/tmp/eval/data --pulls 0.03,0.1,0.3,1 \\
        --questions benchmarks/questions/unseen-postgresql-nodejs.jsonl benchmarks/questions/unseen-2.jsonl

The served adapter (engine.adapter) is one [D, D] map for every question, fitted on the corpus's
heading questions against the whole store. Two questions this answers on one store, every figure
from the same chunk vectors and the same heading questions (the store and its router are only
read):

- how strong the pull towards the identity should be, on the dev questions and on the sets
  nobody tuned to (global dense hit@10 and MRR@10 per pull);
- whether each expert should have its own adapter (its heading questions, its chunks as the
  softmax's candidates, as its scoped search sees them), started from the identity or from the
  global adapter: scored on the oracle scope (exact search over the lists of the question's
  domain expert), beside the global adapter on the same scope.

Each question set's `domain` names its expert (routing.py names the experts after the domains).
Results: benchmarks/results/NAME.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.evalcorpus import is_hit, load_questions
from benchmarks.retrieval_metrics import per_question
from benchmarks.routing import RESULTS

Vectors = npt.NDArray[np.float32]


def first_hits_exact(
    rt: Any,
    questions: list[dict[str, str]],
    vectors: Vectors,
    chunks: Vectors,
    chunk_ids: npt.NDArray[np.int64],
    scopes: list[npt.NDArray[np.bool_]] | None = None,
) -> list[int | None]:
    """Per question, the rank (1-10) of the first hit of an exact search of vectors [Q, D] over
    chunks [M, D] (within scopes[i] [M] bool when given), or None."""
    out: list[int | None] = []
    for i, q in enumerate(questions):
        scores = chunks @ vectors[i]  # [M]
        if scopes is not None:
            scores = np.where(scopes[i], scores, -np.inf)
        top = np.argsort(-scores, kind="stable")[:10]
        rows = rt.pipeline.store.fetch([int(chunk_ids[j]) for j in top])
        found = [rows[int(chunk_ids[j])] for j in top if int(chunk_ids[j]) in rows]
        out.append(next((r for r, c in enumerate(found, 1) if is_hit(c.text, c.source, q)), None))
    return out


def figures(first: list[int | None]) -> dict[str, float]:
    return {m: round(float(per_question(first, m).mean()), 3) for m in ("hit@10", "mrr@10")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True, help="a store routing.py built (only read)")
    ap.add_argument("--pulls", default="0.03,0.1,0.3,1", help="pulls towards the identity, comma-separated")
    ap.add_argument("--questions", type=Path, nargs="*", default=[], help="more question sets beside dev")
    ap.add_argument("--name", default="adapter-variants", help="results file stem under benchmarks/results/")
    args = ap.parse_args()

    from sqlalchemy import select

    from app.core.models import Chunk, stack
    from app.core.settings import Settings
    from app.runtime import Runtime
    from engine.adapter import AdapterConfig, adapt, fit
    from engine.samples import heading_queries

    sets = {"dev": load_questions(None)} | {p.stem: load_questions(p) for p in args.questions}
    rt = Runtime(Settings(data_dir=args.data_dir, question_cache=0, answer_cache=0))
    rt.start()
    try:
        s = rt.settings
        with rt.sessions() as session:
            rows = session.execute(
                select(Chunk.id, Chunk.embedding, Chunk.heading, Chunk.document_id, Chunk.cluster_id).order_by(Chunk.id)
            ).all()
        chunk_ids = np.array([r[0] for r in rows], dtype=np.int64)  # [M]
        chunks = stack((r[1] for r in rows), rt.embedder.dim)  # [M, D]
        profiles = rt.state().experts
        expert_of_list = {c: e for e, p in profiles.items() for c in p.clusters}
        chunk_expert = np.array([expert_of_list.get(r[4], -1) for r in rows], dtype=np.int64)  # [M]
        by_name = {p.name: e for e, p in profiles.items()}
        texts, positives = heading_queries(
            [r[2] for r in rows], [r[3] for r in rows], s.query_adapter_queries, s.router_seed
        )
        heading_vecs = np.concatenate([rt.embedder.encode(texts[i : i + 256]) for i in range(0, len(texts), 256)])
        q_vecs = {k: rt.embedder.encode([q["question"] for q in v]) for k, v in sets.items()}  # [Q, D] each
        scopes = {k: [chunk_expert == by_name.get(q["domain"], -2) for q in v] for k, v in sets.items()}

        def config(pull: float) -> AdapterConfig:
            return AdapterConfig(seed=s.router_seed, pull=pull)

        result: dict[str, Any] = {
            "chunks": len(rows),
            "heading_questions": len(texts),
            "fits": [],  # each fit's held-out heading recall@10, bare -> adapted
            "global": {},
            "oracle scope": {},
        }
        adapters: dict[str, Vectors | None] = {"bare model": None}
        for pull in (float(p) for p in args.pulls.split(",")):
            w, info = fit(heading_vecs, chunks, positives, config(pull))
            adapters[f"global adapter, pull {pull}"] = w
            result["fits"].append({"pull": pull, **info})
            print(json.dumps(result["fits"][-1]), flush=True)
        for name, w in adapters.items():
            result["global"][name] = {
                k: figures(first_hits_exact(rt, v, adapt(w, q_vecs[k]), chunks, chunk_ids)) for k, v in sets.items()
            }
            print(json.dumps({name: result["global"][name]}), flush=True)

        # Per expert: its heading questions (every positive inside it), its chunks as the candidates.
        # An expert whose own adapter is not kept (no better than the bare model) keeps the global one.
        served_pull = AdapterConfig().pull
        w_global = adapters.get(f"global adapter, pull {served_pull}")
        if w_global is None:
            w_global, _ = fit(heading_vecs, chunks, positives, config(served_pull))
        per_expert: dict[str, dict[int, Vectors | None]] = {"from the identity": {}, "from the global adapter": {}}
        for expert in sorted(set(by_name.values())):
            inside = np.flatnonzero(chunk_expert == expert)
            position = np.full(len(rows), -1, dtype=np.int64)
            position[inside] = np.arange(len(inside))
            mine = [i for i, p in enumerate(positives) if (chunk_expert[p] == expert).all()]
            local = [position[positives[i]].tolist() for i in mine]
            for start, init in (("from the identity", None), ("from the global adapter", w_global)):
                w, info = fit(heading_vecs[mine], chunks[inside], local, config(served_pull), init=init)
                per_expert[start][expert] = w if w is not None else w_global
                result["fits"].append({"expert": profiles[expert].name, "start": start, **info})
                print(json.dumps(result["fits"][-1]), flush=True)
        for k, v in sets.items():
            row = {
                "bare model": figures(first_hits_exact(rt, v, q_vecs[k], chunks, chunk_ids, scopes[k])),
                "global adapter": figures(
                    first_hits_exact(rt, v, adapt(w_global, q_vecs[k]), chunks, chunk_ids, scopes[k])
                ),
            }
            for start, ws in per_expert.items():
                vecs = np.stack(
                    [
                        adapt(ws.get(by_name.get(q["domain"], -2), w_global), q_vecs[k][i : i + 1])[0]
                        for i, q in enumerate(v)
                    ]
                )  # [Q, D] each question through its domain expert's adapter
                row[f"per-expert adapters, {start}"] = figures(
                    first_hits_exact(rt, v, vecs, chunks, chunk_ids, scopes[k])
                )
            result["oracle scope"][k] = row
            print(json.dumps({k: row}), flush=True)
    finally:
        rt.close()
    result["command"] = " ".join(["python", *sys.argv])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=2))
    (RESULTS / f"{args.name}.md").write_text(markdown(result) + "\n")
    print(markdown(result))


def markdown(result: dict[str, Any]) -> str:
    sets = list(next(iter(result["global"].values())))
    head = "| {} | " + " | ".join(f"{k} hit@10 (MRR@10)" for k in sets) + " |"
    rule = "|---" * (len(sets) + 1) + "|"
    lines = [head.format("global dense"), rule]
    for name, row in result["global"].items():
        lines.append(f"| {name} | " + " | ".join(f"{row[k]['hit@10']} ({row[k]['mrr@10']})" for k in sets) + " |")
    lines += ["", head.format("oracle scope (the domain expert's lists, exact)"), rule]
    variants = list(result["oracle scope"][sets[0]])
    for name in variants:
        cells = [result["oracle scope"][k][name] for k in sets]
        lines.append(f"| {name} | " + " | ".join(f"{c['hit@10']} ({c['mrr@10']})" for c in cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
