"""Routed vs global vs oracle retrieval, router calibration and /ask latency on the FAQ dev set.

    python benchmarks/evalcorpus.py build  --out /tmp/evalcorpus
    python benchmarks/evalcorpus.py ingest --corpus /tmp/evalcorpus --data-dir /tmp/evaldata
    python benchmarks/routing.py --data-dir /tmp/evaldata

The six documentation domains become the experts: every cluster is mapped to the domain that
holds most of its chunks, and the router is trained on the corpus alone (never on the
questions). Results go to benchmarks/results/routing.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.evalcorpus import domain_of, is_hit, load_questions

RESULTS = Path(__file__).resolve().parent / "results"
DOMAINS = ("debian", "git", "nodejs", "postgresql", "python", "sqlite")
ROUTED = "routed (served pipeline)"


def first_hits(ranked: list[list[tuple[str, str]]], questions: list[dict[str, str]]) -> list[int | None]:
    """Per question, the rank (1-10) of the first hit, or None."""
    return [
        next((r for r, (text, src) in enumerate(chunks[:10], 1) if is_hit(text, src, q)), None)
        for q, chunks in zip(questions, ranked, strict=True)
    ]


def paired_difference(a: list[int | None], b: list[int | None], k: int = 10, rounds: int = 2000) -> dict[str, float]:
    """hit@k of a minus hit@k of b over the same questions, with a 95% paired bootstrap interval."""
    x = np.array([(r is not None and r <= k) for r in a], dtype=float) - np.array(
        [(r is not None and r <= k) for r in b], dtype=float
    )  # [Q] per-question difference in {-1, 0, 1}
    rng = np.random.default_rng(0)
    means = x[rng.integers(0, len(x), (rounds, len(x)))].mean(1)  # [rounds]
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {
        "diff": round(float(x.mean()), 3),
        "ci95": [round(float(lo), 3), round(float(hi), 3)],
        "a_only": int((x > 0).sum()),
        "b_only": int((x < 0).sum()),
    }


def metrics_for(ranked: list[list[tuple[str, str]]], questions: list[dict[str, str]]) -> dict[str, float]:
    """ranked[i] = [(chunk text, source)] best first, for question i."""
    out = {"hit@1": 0.0, "hit@5": 0.0, "hit@10": 0.0, "mrr@10": 0.0, "top1_domain": 0.0}
    for q, chunks, first in zip(questions, ranked, first_hits(ranked, questions), strict=True):
        out["top1_domain"] += bool(chunks) and domain_of(chunks[0][1]) == q["domain"]
        if first is not None:
            out["mrr@10"] += 1 / first
            for k in (1, 5, 10):
                out[f"hit@{k}"] += first <= k
    return {k: round(v / len(questions), 3) for k, v in out.items()}


def setup_experts(rt: Any) -> dict[str, int]:
    """One expert per domain; each cluster to the domain holding most of its chunks."""
    from sqlalchemy import select

    from app.models import Chunk, Cluster, Document, Expert
    from app.services import experts as svc

    with rt.sessions.begin() as s:
        votes: dict[int, Counter[str]] = {}
        for cluster, source in s.execute(select(Chunk.cluster_id, Document.source).join(Document)):
            votes.setdefault(cluster, Counter())[domain_of(source)] += 1
        existing = {e.name: e.id for e in s.scalars(select(Expert))}
        ids = {}
        for d in DOMAINS:
            ids[d] = existing.get(d) or svc.create_expert(s, {"name": d, "description": f"{d} documentation"}).id
        for c in s.scalars(select(Cluster)):
            c.expert_id = ids[votes[c.id].most_common(1)[0][0]] if c.id in votes else None
    rt.experts.invalidate()
    return ids


@dataclass
class Evaluation:
    """What the peers reuse: the question vectors, each domain's clusters, the fallback results."""

    result: dict[str, Any]
    ranked: dict[str, list[list[tuple[str, str]]]]  # system -> per question [(text, source)] best first
    q_vecs: np.ndarray  # [Q, D]
    domain_clusters: dict[str, list[int]]
    hybrid: list[list[tuple[str, str]]]
    resolve: Callable[[np.ndarray], list[tuple[str, str]]]
    rt: Any


def evaluate(
    rt: Any, questions: list[dict[str, str]], *, train: bool = True, latency_questions: int = 100
) -> Evaluation:
    """Every moerag retrieval mode, the router's quality and /ask latency, on a started Runtime."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from engine.pipeline import AskRequest
    from engine.router import evaluate as evaluate_router

    settings = rt.settings
    stats = rt.stats()
    if stats["clusters"] <= 1:
        print("clustering the corpus ...", flush=True)
        rt.indexes.recluster()
        stats = rt.stats()
    print(f"{stats['chunks']} chunks in {stats['clusters']} clusters", flush=True)
    ids = setup_experts(rt)
    t0 = time.perf_counter()
    if train:
        print("training the router ...", flush=True)
        print(json.dumps(rt.routers.train()), flush=True)
    train_s = time.perf_counter() - t0
    router = rt.routers.current()
    assert router is not None
    profiles = rt.experts.profiles()
    domain_clusters = {d: list(profiles[ids[d]].clusters) for d in DOMAINS}
    index = rt.indexes.index
    sizes = index.list_sizes()

    q_vecs = rt.embedder.encode([q["question"] for q in questions])  # [Q, D]
    store = rt.pipeline.store

    def resolve(hit_ids: np.ndarray) -> list[tuple[str, str]]:
        found = [int(i) for i in hit_ids if i >= 0]
        rows = store.fetch(found)
        return [(rows[i].text, rows[i].source) for i in found if i in rows]

    # Global dense (exact) and oracle (true domain's clusters) retrieval.
    _, global_ids = index.search(q_vecs, 10)
    global_dense = [resolve(r) for r in global_ids]
    oracle = [
        resolve(index.search(q_vecs[i : i + 1], 10, domain_clusters[q["domain"]])[1][0])
        for i, q in enumerate(questions)
    ]
    # The pipeline as served: routed, and forced fallback (global hybrid).
    routed, hybrid, routes, prepare_ms, gate_ms, route_ms = [], [], [], [], [], []
    for q in questions:
        t = time.perf_counter()
        p = rt.pipeline.prepare(AskRequest(q["question"], top_k=10))
        prepare_ms.append((time.perf_counter() - t) * 1000)
        gate_ms.append(p.timings_ms.get("embed", 0.0) + p.timings_ms.get("route", 0.0))
        route_ms.append(p.timings_ms.get("route", 0.0))
        routed.append([(c.chunk.text, c.chunk.source) for c in p.citations])
        routes.append(p.route)
        f = rt.pipeline.prepare(AskRequest(q["question"], top_k=10, mode="fallback"))
        hybrid.append([(c.chunk.text, c.chunk.source) for c in f.citations])

    # "Why not just IVF": the same lists, probing the nearest ones until as many vectors are
    # scanned as the expert path scans on average.
    scanned_expert = [r.vectors_scanned for r in routes if r.path == "expert"]
    budget = statistics.mean(scanned_expert) if scanned_expert else float(sizes.sum())
    order = np.argsort(-(q_vecs @ index.centroids().T), axis=1)  # [Q, C] nearest lists first
    ivf, ivf_scanned = [], []
    for i in range(len(questions)):
        cum = np.cumsum(sizes[order[i]])
        nprobe = int(np.searchsorted(cum, budget) + 1)
        ivf_scanned.append(int(cum[min(nprobe, len(cum)) - 1]))
        ivf.append(resolve(index.search(q_vecs[i : i + 1], 10, order[i, :nprobe])[1][0]))

    # Router quality on the questions themselves.
    position = {e: i for i, e in enumerate(router.expert_ids)}
    labels = torch.tensor([position[ids[q["domain"]]] for q in questions])
    quality = evaluate_router(router.logits(q_vecs), labels, router.temperature, settings.route_threshold)
    expert_path = [r.path == "expert" for r in routes]
    right = [r.expert is not None and r.expert.name == q["domain"] for r, q in zip(routes, questions, strict=True)]
    on_path = [ok for ok, e in zip(right, expert_path, strict=True) if e]

    # /ask latency through HTTP (in-process client), extractive generator.
    app = create_app(settings, runtime=rt)
    lat = []
    with TestClient(app) as client:
        for q in questions[:latency_questions]:
            t = time.perf_counter()
            r = client.post("/ask", json={"question": q["question"]})
            lat.append((time.perf_counter() - t) * 1000)
            assert r.status_code == 200, r.text
    lat.sort()
    prepare_ms.sort()
    gate_ms.sort()
    route_ms.sort()

    ranked = {
        ROUTED: routed,
        "global dense (exact)": global_dense,
        "global hybrid (fallback path)": hybrid,
        "oracle route": oracle,
        "FAISS IVF, nearest lists up to the expert path's scan": ivf,
    }
    result = {
        "corpus": {"chunks": stats["chunks"], "clusters": stats["clusters"], "questions": len(questions)},
        "retrieval": {name: metrics_for(r, questions) for name, r in ranked.items()},
        "router": {
            "accuracy": round(quality["accuracy"], 3),
            "ece_before": round(quality["ece_before"], 4),
            "ece_after": round(quality["ece_after"], 4),
            "temperature": round(router.temperature, 3),
            "coverage_at_threshold": round(quality["coverage_at_threshold"], 3),
            "accuracy_at_threshold": round(quality["accuracy_at_threshold"], 3),
            "expert_path_share": round(sum(expert_path) / len(questions), 3),
            "expert_path_accuracy": round(sum(on_path) / max(len(on_path), 1), 3),
            "train_seconds": round(train_s, 1),
            "gate_ms_p50": percentile(gate_ms, 50),  # embed the question + route
            "route_only_ms_p50": percentile(route_ms, 50),  # the gate alone: the overhead over plain RAG
            "fallback_reasons": dict(Counter(r.reason for r in routes if r.path == "fallback")),
        },
        "vectors_scanned": {
            "expert path (mean)": round(statistics.mean(scanned_expert), 1) if scanned_expert else None,
            "global": int(sizes.sum()),
            "IVF baseline (mean)": round(statistics.mean(ivf_scanned), 1),
        },
        "ask_latency_ms": {
            "p50": percentile(lat, 50),
            "p95": percentile(lat, 95),
            "n": len(lat),
        },
        "prepare_latency_ms": {"p50": percentile(prepare_ms, 50), "p95": percentile(prepare_ms, 95)},
    }
    return Evaluation(result, ranked, q_vecs, domain_clusters, hybrid, resolve, rt)


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = min(len(sorted_values) - 1, max(0, int(np.ceil(p / 100 * len(sorted_values))) - 1))
    return round(sorted_values[rank], 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--questions", type=Path, help="default: ../shared/eval/faq-dev.jsonl")
    ap.add_argument("--skip-train", action="store_true", help="evaluate the active router as it is")
    ap.add_argument("--latency-questions", type=int, default=100)
    args = ap.parse_args()

    from app.runtime import Runtime
    from app.settings import Settings

    questions = load_questions(args.questions)
    rt = Runtime(Settings(data_dir=args.data_dir))
    rt.start()
    try:
        result = evaluate(rt, questions, train=not args.skip_train, latency_questions=args.latency_questions).result
        result["command"] = " ".join(["python", *sys.argv])
    finally:
        rt.close()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "routing.json").write_text(json.dumps(result, indent=2))
    lines = ["| retrieval | hit@1 | hit@5 | hit@10 | MRR@10 |", "|---|---|---|---|---|"]
    for name, m in result["retrieval"].items():
        lines.append(f"| {name} | {m['hit@1']} | {m['hit@5']} | {m['hit@10']} | {m['mrr@10']} |")
    (RESULTS / "routing.md").write_text("\n".join(lines) + "\n\n```json\n" + json.dumps(result, indent=2) + "\n```\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
