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
import itertools
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import percentile, write_result
from benchmarks.evalcorpus import FAQ_PAGES, domain_of, load_questions
from benchmarks.retrieval_metrics import first_hits, metrics_for, paired_difference
from benchmarks.routing_report import (
    DOMAINS,
    MISS_DEPTH,
    domain_leakage,
    markdown,
    miss_anatomy,
    page_experts,
    path_figures,
    route_losses,
    router_figures,
)

RESULTS = Path(__file__).resolve().parent / "results"
QUESTION_SETS = Path(__file__).resolve().parent / "questions"  # written by hand, never used to choose (README there)
ROUTED = "routed (served pipeline)"


def setup_experts(rt: Any) -> dict[str, int]:
    """One expert per domain; each cluster to the domain holding most of its chunks; documents re-placed."""
    from sqlalchemy import select

    from app.core.models import Chunk, Cluster, Document, Expert
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
    print(json.dumps({"realign": rt.indexes.realign()}), flush=True)
    return ids


def per_domain(ranked: dict[str, list[list[tuple[str, str]]]], questions: list[dict[str, str]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for d in sorted({q["domain"] for q in questions}):
        pick = [i for i, q in enumerate(questions) if q["domain"] == d]
        qs = [questions[i] for i in pick]
        out[d] = {"questions": len(pick)} | {
            name: metrics_for([r[i] for i in pick], qs)["hit@10"] for name, r in ranked.items()
        }
    return out


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
    experts: dict[str, int]  # domain -> its expert's id, as `setup_experts` mapped the store


def served(
    rt: Any, questions: list[dict[str, str]], top_k: int = 10, **kw: Any
) -> tuple[list[list[tuple[str, str]]], list[Any]]:
    """The pipeline as served, top `top_k` per question: (ranked, prepared)."""
    from engine.pipeline import AskRequest

    preps = [rt.pipeline.prepare(AskRequest(q["question"], top_k=top_k, **kw)) for q in questions]
    return [[(c.chunk.text, c.chunk.source) for c in p.citations] for p in preps], preps


def rank_on_path(rt: Any, q: dict[str, str], route: Any) -> int | None:
    """The first hit's rank in the top MISS_DEPTH of the path `route` took (its expert, forced, or
    the fallback), asked again that deep; None: not there."""
    on_expert = route.path == "expert" and route.expert is not None
    path = {"mode": "expert", "expert_id": route.expert.id} if on_expert else {"mode": "fallback"}
    ranked, _ = served(rt, [q], top_k=MISS_DEPTH, **path)
    return first_hits(ranked, [q], depth=MISS_DEPTH)[0]


def faq_documents(rt: Any) -> list[int]:
    from sqlalchemy import select

    from app.core.models import Document

    with rt.sessions() as s:
        return [i for i, src in s.execute(select(Document.id, Document.source)) if FAQ_PAGES.match(src)]


def evaluate(
    rt: Any,
    questions: list[dict[str, str]],
    *,
    train: bool = True,
    latency_questions: int = 100,
    reference: list[list[tuple[str, str]]] | None = None,
    faq_blind: bool = False,
    lexical_weights: tuple[float, ...] = (),
    experts: dict[str, int] | None = None,
) -> Evaluation:
    """Every moerag retrieval mode, the router's quality and /ask latency, on a started Runtime.

    reference: the plain reference pipeline's top 10 per question (benchmarks/reference.py).
    faq_blind: also train a router with the FAQ pages left out of its data and score it again.
    lexical_weights: BM25 weights to sweep (routed, fallback and oracle hit@10 for each).
    experts: each domain's expert, when an earlier evaluation of this run mapped the store (its
    `experts`): the store is neither mapped again (a read and placement of every chunk) nor its
    leakage measured again (`leakage` is None; the earlier result has it).
    """
    from fastapi.testclient import TestClient

    from app.api.main import create_app

    settings = rt.settings
    stats = rt.stats()
    if stats["clusters"] <= 1:
        print("clustering the corpus ...", flush=True)
        rt.indexes.recluster()
        stats = rt.stats()
    print(f"{stats['chunks']} chunks in {stats['clusters']} clusters", flush=True)
    leakage: dict[str, Any] | None = None  # measured where the store is mapped, once a run
    if experts is None:
        ids = setup_experts(rt)
        leakage = domain_leakage(rt, ids)
        print(json.dumps({"leakage": leakage}), flush=True)
    else:
        ids = experts
    t0 = time.perf_counter()
    if train:
        print("training the router ...", flush=True)
        print(json.dumps(rt.routers.train(force=True)), flush=True)
        rt.catalogue.sync()  # the pipeline serves the new version from here on, not after the next poll
    train_s = time.perf_counter() - t0
    profiles = rt.state().experts
    domain_clusters = {d: list(profiles[ids[d]].clusters) for d in DOMAINS}
    index = rt.indexes.index
    sizes = index.list_sizes()

    q_vecs = rt.embedder.encode([q["question"] for q in questions])  # [Q, D] the gate's input
    active = rt.state().router
    r_vecs = rt.pipeline.retrieval_vector(q_vecs, active)  # [Q, D] retrieval's, as served
    adapted = r_vecs is not q_vecs
    store = rt.pipeline.store

    def resolve(hit_ids: np.ndarray) -> list[tuple[str, str]]:
        found = [int(i) for i in hit_ids if i >= 0]
        rows = store.fetch(found)
        return [(rows[i].text, rows[i].source) for i in found if i in rows]

    # Global dense (exact) and the dense oracle (every list of the true domain).
    _, global_ids = index.search(r_vecs, 10)
    global_dense = [resolve(r) for r in global_ids]
    bare_dense = [resolve(r) for r in index.search(q_vecs, 10)[1]] if adapted else None
    oracle_dense = [
        resolve(index.search(r_vecs[i : i + 1], 10, domain_clusters[q["domain"]])[1][0])
        for i, q in enumerate(questions)
    ]
    # The pipeline as served: routed; forced fallback (global hybrid); the expert path of the true domain.
    prepare_ms, gate_ms, route_ms = [], [], []
    routed, routes = [], []
    for q in questions:
        t = time.perf_counter()
        r, (p,) = served(rt, [q])
        prepare_ms.append((time.perf_counter() - t) * 1000)
        gate_ms.append(p.timings_ms.get("embed", 0.0) + p.timings_ms.get("route", 0.0))
        route_ms.append(p.timings_ms.get("route", 0.0))
        routed += r
        routes.append(p.route)
    hybrid, _ = served(rt, questions, mode="fallback")
    oracle = []
    for q in questions:
        oracle += served(rt, [q], mode="expert", expert_id=ids[q["domain"]])[0]
    # The expert path of the expert holding the answer's page, where that is not the domain's.
    pages = page_experts(rt, questions)
    elsewhere = [i for i, (q, p) in enumerate(zip(questions, pages, strict=True)) if p not in (None, ids[q["domain"]])]
    page_oracle = list(oracle)
    for i in elsewhere:
        page_oracle[i] = served(rt, [questions[i]], mode="expert", expert_id=pages[i])[0][0]

    # "Why not just IVF": the same lists, probing the nearest ones until as many vectors are
    # scanned as the expert path scans on average.
    scanned_expert = [r.vectors_scanned for r in routes if r.path == "expert"]
    budget = statistics.mean(scanned_expert) if scanned_expert else float(sizes.sum())
    order = np.argsort(-(r_vecs @ index.centroids().T), axis=1)  # [Q, C] nearest lists first
    ivf, ivf_scanned = [], []
    for i in range(len(questions)):
        cum = np.cumsum(sizes[order[i]])
        nprobe = int(np.searchsorted(cum, budget) + 1)
        ivf_scanned.append(int(cum[min(nprobe, len(cum)) - 1]))
        ivf.append(resolve(index.search(r_vecs[i : i + 1], 10, order[i, :nprobe])[1][0]))

    router = router_figures(rt, questions, q_vecs, ids, routes, pages)
    router |= {k: v for k, v in (active.metrics if active is not None else {}).items() if k.startswith("adapter")}

    # /ask latency through HTTP (in-process client), extractive generator.
    # No `with`: the app's lifespan would close the runtime this evaluation goes on using.
    client = TestClient(create_app(settings, runtime=rt))
    lat = []
    for q in questions[:latency_questions]:
        t = time.perf_counter()
        resp = client.post("/ask", json={"question": q["question"]})
        lat.append((time.perf_counter() - t) * 1000)
        assert resp.status_code == 200, resp.text
    lat.sort()
    prepare_ms.sort()
    gate_ms.sort()
    route_ms.sort()

    ranked = {
        ROUTED: routed,
        "global dense (exact)": global_dense,
        "global hybrid (fallback path)": hybrid,
        "oracle route (served expert path, true domain)": oracle,
        "oracle dense (every list of the true domain)": oracle_dense,
        "FAISS IVF, nearest lists up to the expert path's scan": ivf,
    }
    if elsewhere:
        ranked["oracle route (served expert path, the expert holding the answer's page)"] = page_oracle
    if bare_dense is not None:
        ranked["global dense, no query adapter"] = bare_dense
    if reference is not None:
        ranked["plain reference (200-word windows, flat)"] = reference
    router["train_seconds"] = round(train_s, 1)
    router["gate_ms_p50"] = percentile(gate_ms, 50)  # embed the question + route
    router["route_only_ms_p50"] = percentile(route_ms, 50)  # the gate alone: the overhead over plain RAG
    result: dict[str, Any] = {
        "corpus": {"chunks": stats["chunks"], "clusters": stats["clusters"], "questions": len(questions)},
        "retrieval": {name: metrics_for(r, questions) for name, r in ranked.items()},
        "router": router,
        "leakage": leakage,
        "answer_pages_outside_their_domain_expert": len(elsewhere),
        "vectors_scanned": {
            "expert path (mean)": round(statistics.mean(scanned_expert), 1) if scanned_expert else None,
            "global": int(sizes.sum()),
            "expert path share of global": round(statistics.mean(scanned_expert) / float(sizes.sum()), 3)
            if scanned_expert
            else None,
            "IVF baseline (mean)": round(statistics.mean(ivf_scanned), 1),
        },
        "ask_latency_ms": {"p50": percentile(lat, 50), "p95": percentile(lat, 95), "n": len(lat)},
        "prepare_latency_ms": {"p50": percentile(prepare_ms, 50), "p95": percentile(prepare_ms, 95)},
    }
    if lexical_weights:
        config = rt.pipeline.config
        served_weight = config.lexical_weight
        sweep = {}
        for w in lexical_weights:
            config.lexical_weight = w
            row = {
                "routed": metrics_for(served(rt, questions)[0], questions)["hit@10"],
                "fallback": metrics_for(served(rt, questions, mode="fallback")[0], questions)["hit@10"],
                "oracle": metrics_for(
                    [served(rt, [q], mode="expert", expert_id=ids[q["domain"]])[0][0] for q in questions], questions
                )["hit@10"],
            }
            sweep[str(w)] = row
            print(json.dumps({"lexical_weight": w, **row}), flush=True)
        config.lexical_weight = served_weight
        result["lexical_weight_sweep_hit@10"] = sweep
    if faq_blind:
        print("training a router with the FAQ pages left out ...", flush=True)
        full_version = rt.state().router.version_id
        info = rt.routers.train(exclude_documents=faq_documents(rt), force=True)
        rt.catalogue.sync()
        blind_ranked, blind_preps = served(rt, questions)
        ranked[ROUTED + ", FAQ-blind router"] = blind_ranked
        result["retrieval"][ROUTED + ", FAQ-blind router"] = metrics_for(blind_ranked, questions)
        blind_routes = [p.route for p in blind_preps]
        result["router_faq_blind"] = router_figures(rt, questions, q_vecs, ids, blind_routes, pages)
        result["router_faq_blind"]["trained_on"] = {k: info.get(k) for k in ("chunks", "samples", "held_out_documents")}
        result["router_faq_blind"] |= {k: v for k, v in info.items() if k.startswith("adapter")}
        rt.routers.activate(full_version)
        rt.catalogue.sync()
    result["per_domain_hit@10"] = per_domain(ranked, questions)
    routed_first = first_hits(routed, questions)
    firsts = {"routed": routed_first, "hybrid": first_hits(hybrid, questions), "oracle": first_hits(oracle, questions)}
    result["route_losses"] = route_losses(questions, routes, firsts)
    deeper = {i: rank_on_path(rt, questions[i], routes[i]) for i, r in enumerate(routed_first) if r is None}
    result["miss_anatomy"] = miss_anatomy(routes, pages, routed_first, deeper)
    result["routed_minus"] = {
        name: paired_difference(routed_first, first_hits(r, questions)) for name, r in ranked.items() if name != ROUTED
    }
    return Evaluation(result, ranked, q_vecs, domain_clusters, hybrid, resolve, rt, ids)


def also(rt: Any, path: Path, experts: dict[str, int]) -> dict[str, Any]:
    """One more question set, scored as the main one is, on the store as the main run mapped it
    (`experts`) and the router it left active."""
    print(f"scoring {path} ...", flush=True)
    result = evaluate(rt, load_questions(path), train=False, latency_questions=0, experts=experts).result
    result["questions_file"] = str(path)
    return result


def prepare_store(rt: Any, corpus: Path) -> dict[str, Any]:
    """Ingest the mirror into an empty store (embeddings come from the text-hash cache when present)."""
    from benchmarks.evalcorpus import ingest_into

    if rt.stats()["chunks"]:
        return {"ingested": False}
    info = ingest_into(rt, corpus)
    print("clustering the corpus ...", flush=True)
    rt.indexes.recluster()
    return {"ingested": True, **info}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--corpus", type=Path, help="the eval mirror (built here if missing); needed to ingest")
    ap.add_argument("--cache", type=Path, help="embedding cache by text hash (benchmarks/embcache.py)")
    ap.add_argument("--questions", type=Path, help="default: ../shared/eval/faq-dev.jsonl")
    ap.add_argument("--skip-train", action="store_true", help="evaluate the active router as it is")
    ap.add_argument("--no-faq-blind", action="store_true", help="skip the router trained without the FAQ pages")
    ap.add_argument(
        "--no-reference",
        action="store_true",
        help="skip the plain reference pipeline (embedding its ~38k windows takes about an hour on a float32 CPU)",
    )
    ap.add_argument("--latency-questions", type=int, default=100)
    ap.add_argument("--lexical-weights", default="", help="BM25 weights to sweep, e.g. 0,0.1,0.25,0.5")
    ap.add_argument("--name", default="routing", help="results file stem")
    ap.add_argument("--results", type=Path, default=RESULTS, help="where the results go (default benchmarks/results/)")
    ap.add_argument(
        "--also",
        type=Path,
        nargs="*",
        default=sorted(QUESTION_SETS.glob("*.jsonl")),
        help="more question sets scored in the same run, on the same store and router, after the main set "
        "(results under `also`; the main set itself is skipped); default: benchmarks/questions/*.jsonl, none "
        "with a bare --also",
    )
    args = ap.parse_args()
    again = args.questions.resolve() if args.questions is not None else None  # the main set: scored already
    also_sets = [path for path in args.also if path.resolve() != again]
    if len({path.stem for path in also_sets}) < len(also_sets):  # results are keyed by file name
        ap.error(f"--also: two sets share a file name: {[str(p) for p in also_sets]}")

    from app.core.settings import Settings
    from app.runtime import Runtime
    from benchmarks.embcache import EmbeddingCache, cached
    from benchmarks.evalcorpus import build
    from benchmarks.reference import reference_ranked
    from engine.embedder import Embedder

    questions = load_questions(args.questions)
    embedder = Embedder()
    cache = EmbeddingCache(args.cache, embedder) if args.cache else None
    if cache is not None:
        cached(embedder, cache)
    if args.corpus is not None and not args.corpus.exists():
        print(json.dumps({"mirror": build(args.corpus)}), flush=True)
    # No question cache: the latency loop re-asks questions the evaluation already asked.
    rt = Runtime(Settings(data_dir=args.data_dir, question_cache=0, answer_cache=0), embedder=embedder)
    rt.start()
    try:
        ingest = prepare_store(rt, args.corpus) if args.corpus is not None else {"ingested": False}
        reference, ref_info = None, {}
        if cache is not None:
            embedder.encode = cache.uncached  # from here on the model itself: latencies are real
        if args.corpus is not None and cache is not None and not args.no_reference:
            q_vecs = embedder.encode([q["question"] for q in questions])
            reference, ref_info = reference_ranked(args.corpus, cache, q_vecs)
        ev = evaluate(
            rt,
            questions,
            train=not args.skip_train,
            latency_questions=args.latency_questions,
            reference=reference,
            faq_blind=not args.no_faq_blind,
            lexical_weights=tuple(float(w) for w in args.lexical_weights.split(",") if w),
        )
        result = ev.result
        result["also"] = {path.stem: also(rt, path, ev.experts) for path in also_sets}
        result["ingest"] = ingest
        result["reference"] = ref_info
        result["model"] = {"name": embedder.name, "dtype": embedder.dtype_name}
        result["command"] = " ".join(["python", *sys.argv])
    finally:
        rt.close()
    args.results.mkdir(parents=True, exist_ok=True)
    write_result(args.results / f"{args.name}.json", result)
    report = markdown(result) + "\n\n```json\n" + json.dumps(result, indent=2) + "\n```\n"
    (args.results / f"{args.name}.md").write_text(report)
    print(markdown(result))


def sweep_main(argv: list[str]) -> None:
    """`sweep`: the served pipeline's routing knobs swept on the dev questions, over a store `routing.py` built.

        python benchmarks/routing.py sweep --data-dir DATA_DIR \
            --grid '{"expert_verify_lexical_slack": [0, 0.06], "expert_nprobe": [16, 32]}'

    Every combination of the grid's `PipelineConfig` fields (the others stay at their defaults)
    answers every question through `AskPipeline.prepare`, with the active router and the domain
    experts of `routing.setup_experts`. One JSON line per combination: routed hit@10 and MRR@10,
    the share of questions on the expert path, the share of those sent to the right domain, the
    vectors the expert path scanned on average, the share of questions routed as the first
    combination routed them (path and expert), and each metric's paired difference from the
    first combination with a 95% bootstrap interval. Tune on dev only; the held-back questions judge.
    """
    ap = argparse.ArgumentParser(
        prog="routing.py sweep", description=sweep_main.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data-dir", type=Path, required=True, help="a store routing.py built (router trained)")
    ap.add_argument("--grid", required=True, help="JSON: PipelineConfig field -> list of values")
    ap.add_argument("--questions", type=Path, help="default: ../shared/eval/faq-dev.jsonl")
    ap.add_argument(
        "--codec", choices=["flat", "sq8"], default="flat", help="MOERAG_INDEX_CODEC (sq8 rebuilds the copy)"
    )
    ap.add_argument("--name", help="also write the rows to benchmarks/results/<name>.json")
    args = ap.parse_args(argv)

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
        first_routes: list[tuple[str, int | None]] | None = None  # and its routes (path, expert)
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
            taken = [(r.path, r.expert.id if r.path == "expert" and r.expert is not None else None) for r in routes]
            first_routes = taken if first_routes is None else first_routes
            row = {
                **combo,
                "hit@10": m["hit@10"],
                "mrr@10": m["mrr@10"],
                "expert_path_share": share,
                "right_on_path": right,
                "vectors_scanned": round(sum(scanned) / max(1, len(scanned))),
                "same_route_as_first": round(
                    sum(a == b for a, b in zip(taken, first_routes, strict=True)) / len(taken), 3
                ),
                "minus_first": {
                    k: paired_difference(first, baseline, k) for k in ("hit@1", "hit@5", "hit@10", "mrr@10")
                },
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
        rt.pipeline.config = served_config
        if args.name:
            out = {
                "command": "python benchmarks/routing.py " + " ".join(sys.argv[1:]),
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
    if sys.argv[1:2] == ["sweep"]:
        sweep_main(sys.argv[2:])
    else:
        main()
