"""The held-out-topic protocol (issue 40): what the gate does with a topic its experts never saw.

For each held-out domain: a fresh store of the other five domains of the evaluation mirror, one
expert per domain (each list to the domain holding most of its chunks, documents re-placed), a
router trained on it; then the held-out domain's pages are ingested as a team adds documents,
and its dev questions are asked. Reported, with the open-set check on (the default) and off (the
gate alone, as before it):

- held-out: the share of its questions routed confidently to an expert (the aim: at most 10%),
  their reasons, and hit@10 (the fallback still has to find the answer);
- in-domain (the other domains' dev questions, same store): expert-path coverage and hit@10
  (the aim: within 1 point of the check off);
- the drift report after the ingest: documents that fit no expert, against the domain's pages.

With `--known-share 0.1` it also measures the cost on content that is not new: a store of all six
domains less a random tenth of their pages (seed 0), six experts, a router; then that tenth is
ingested as a team adds documents on known topics. Reported: the share of those documents the
drift report counts as fitting no expert (false alarms), and every dev question's expert-path
coverage and hit@10 with the check on and off.

    python benchmarks/evalcorpus.py build --out CORPUS
    python benchmarks/held_out_topic.py --corpus CORPUS --work HELD_DIR \
        --cache EMB_CACHE --domains git sqlite debian --known-share 0.1

Results: benchmarks/results/held-out-topic.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import write_result
from benchmarks.evalcorpus import domain_of, html_files, is_hit, load_questions, uploads

RESULTS = Path(__file__).resolve().parent / "results"


def ingest(rt: Any, corpus: Path, files: list[Path]) -> dict[str, float]:
    t0, chunks = time.perf_counter(), 0
    for done, outcome in enumerate(rt.ingestor.ingest_many(uploads(files, corpus)), start=1):
        chunks += outcome.added
        if done % 250 == 0:
            print(f"ingest: {done}/{len(files)} pages, {chunks} chunks", flush=True)
    rt.catalogue.sync()
    rt.lexical.refresh(force=True)  # a server's checkpoint loop would; the gate's BM25 vote reads it
    return {"pages": len(files), "chunks": chunks, "seconds": round(time.perf_counter() - t0, 1)}


def map_domains(rt: Any, domains: list[str]) -> dict[str, int]:
    """One expert per present domain; each list to the domain holding most of its chunks."""
    from sqlalchemy import select

    from app.core.models import Chunk, Cluster, Document
    from app.services import experts as svc

    with rt.sessions.begin() as s:
        votes: dict[int, Counter[str]] = {}
        for cluster, source in s.execute(select(Chunk.cluster_id, Document.source).join(Document)):
            votes.setdefault(cluster, Counter())[domain_of(source)] += 1
        ids = {d: svc.create_expert(s, {"name": d, "description": f"{d} documentation"}).id for d in domains}
        for c in s.scalars(select(Cluster)):
            c.expert_id = ids[votes[c.id].most_common(1)[0][0]] if c.id in votes else None
    rt.catalogue.sync()
    rt.indexes.realign()
    rt.catalogue.sync()
    return ids


def ask(rt: Any, questions: list[dict[str, str]], open_set: bool) -> dict[str, Any]:
    from engine.pipeline import AskRequest

    rt.pipeline.config.open_set_passages = 3 if open_set else 0
    routed, hits, reasons = 0, 0, Counter[str]()
    for q in questions:
        p = rt.pipeline.prepare(AskRequest(q["question"], top_k=10))
        routed += p.route.path == "expert"
        reasons[p.route.reason] += 1
        hits += any(is_hit(c.chunk.text, c.chunk.source, q) for c in p.citations[:10])
    n = max(len(questions), 1)
    return {
        "questions": len(questions),
        "expert_path": round(routed / n, 4),
        "hit@10": round(hits / n, 4),
        "reasons": dict(reasons.most_common()),
    }


def fit_experts(rt: Any, args: argparse.Namespace, known: list[Path], domains: list[str]) -> dict[str, Any]:
    """Ingest `known`, cluster it, one expert per domain, a router trained and active."""
    out: dict[str, Any] = {"known": ingest(rt, args.corpus, known)}
    out["recluster"] = rt.indexes.recluster()
    rt.catalogue.sync()
    map_domains(rt, domains)
    t0 = time.perf_counter()
    trained = rt.routers.train(activate=True, force=True)
    rt.catalogue.sync()
    out["router"] = {"version": trained["version"], "seconds": round(time.perf_counter() - t0, 1)}
    return out


def run_domain(held: str, args: argparse.Namespace, embedder: Any, questions: list[dict[str, str]]) -> dict[str, Any]:
    from app.core.settings import Settings
    from app.runtime import Runtime
    from benchmarks.routing_report import DOMAINS

    data = args.work / f"held-{held}"
    shutil.rmtree(data, ignore_errors=True)
    rt = Runtime(Settings(data_dir=data, question_cache=0, answer_cache=0), embedder=embedder)
    rt.start(run_jobs=False)
    try:
        files = html_files(args.corpus)
        known = [f for f in files if domain_of(f.relative_to(args.corpus).as_posix()) != held]
        new = [f for f in files if domain_of(f.relative_to(args.corpus).as_posix()) == held]
        out = fit_experts(rt, args, known, [d for d in DOMAINS if d != held])
        inside = [q for q in questions if q["domain"] != held]
        out["in_domain_before_ingest"] = {"on": ask(rt, inside, True), "off": ask(rt, inside, False)}
        out["held_out_ingest"] = ingest(rt, args.corpus, new)
        drift = rt.routers.staleness()["drift"]
        out["drift"] = {"documents": drift["documents"], "chunks": drift["chunks"], "held_out_pages": len(new)}
        drifted = [d["source"] for d in drift["shown"]]
        out["drift"]["shown_from_held_out"] = sum(domain_of(s) == held for s in drifted)
        out["drift"]["shown"] = len(drifted)
        outside = [q for q in questions if q["domain"] == held]
        out["held_out"] = {"on": ask(rt, outside, True), "off": ask(rt, outside, False)}
        out["in_domain"] = {"on": ask(rt, inside, True), "off": ask(rt, inside, False)}
        print(json.dumps({held: out}), flush=True)
        return out
    finally:
        rt.close()


def run_known(args: argparse.Namespace, embedder: Any, questions: list[dict[str, str]]) -> dict[str, Any]:
    """New documents on known topics: how many the drift report flags, what the check costs."""
    import random

    from app.core.settings import Settings
    from app.runtime import Runtime
    from benchmarks.routing_report import DOMAINS

    data = args.work / "held-known"
    shutil.rmtree(data, ignore_errors=True)
    rt = Runtime(Settings(data_dir=data, question_cache=0, answer_cache=0), embedder=embedder)
    rt.start(run_jobs=False)
    try:
        files = html_files(args.corpus)
        later = set(random.Random(0).sample(range(len(files)), round(args.known_share * len(files))))
        new = [f for i, f in enumerate(files) if i in later]
        out = fit_experts(rt, args, [f for i, f in enumerate(files) if i not in later], list(DOMAINS))
        out["new_known_ingest"] = ingest(rt, args.corpus, new)
        drift = rt.routers.staleness()["drift"]
        out["drift"] = {"documents": drift["documents"], "chunks": drift["chunks"], "new_pages": len(new)}
        out["drift"]["false_alarm_share"] = round(drift["documents"] / max(len(new), 1), 4)
        out["questions"] = {"on": ask(rt, questions, True), "off": ask(rt, questions, False)}
        print(json.dumps({"known": out}), flush=True)
        return out
    finally:
        rt.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="the eval mirror (benchmarks/evalcorpus.py build)")
    ap.add_argument("--work", type=Path, required=True, help="where the stores are built (one per domain)")
    ap.add_argument("--cache", type=Path, help="embedding cache by text hash (benchmarks/embcache.py)")
    ap.add_argument("--domains", nargs="*", default=["git", "sqlite", "debian"])
    ap.add_argument("--known-share", type=float, default=0.0, help="also ingest this share of pages late (run_known)")
    ap.add_argument("--name", default="held-out-topic")
    args = ap.parse_args()

    from benchmarks.embcache import EmbeddingCache, cached
    from engine.embedder import Embedder

    embedder = Embedder()
    if args.cache is not None:
        cached(embedder, EmbeddingCache(args.cache, embedder))
    questions = load_questions()
    result: dict[str, Any] = {"domains": {}}
    for held in args.domains:
        result["domains"][held] = run_domain(held, args, embedder, questions)
    if args.known_share > 0:
        result["new_known_documents"] = run_known(args, embedder, questions)
    result["command"] = " ".join(["python", *sys.argv])
    result["model"] = {"name": embedder.name, "dtype": embedder.dtype_name}
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_result(RESULTS / f"{args.name}.json", result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
