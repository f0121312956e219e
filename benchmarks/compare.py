"""moerag against its peers on the Debian documentation corpus, in one command.

    python benchmarks/compare.py --work WORK_DIR          # everything (hours; resumable)
    python benchmarks/compare.py --work DIR --stages quality load report  # some stages

Stages (each prints progress; the slow ones skip what is already built under --work):

1. corpus     mirror of ../shared/eval/corpus.md's six domains, FAQ questions stripped (evalcorpus.py)
2. ingest     moerag ingestion of the mirror into WORK/moerag (resumes; duplicates skipped by hash)
3. peer       the LangChain FAISS pipeline over the same pages into WORK/langchain (peers.py)
4. quality    one process, FAQ dev questions: moerag routed / global dense / hybrid / oracle, FAISS IVF
              at the expert path's scan, the plain reference pipeline (reference.py), a router blind
              to the FAQ pages, LangChain, semantic-router as the gate (routing.py + below)
5. speed      ingestion of the same pages, in one run: raw encode, moerag, LangChain (pages/s, chunks/s)
6. load       /ask p50/p95/p99 and throughput, moerag and the LangChain peer as services (load.py)
7. scaling    latency, recall and memory at 10k, 100k, 1M chunks: expert path vs global vs IVF (scaling.py)
8. report     benchmarks/results/compare.{json,md} and PNG plots

Results of each stage go to RESULTS/compare-<stage>.json as soon as it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import evalcorpus, load, peers, routing, scaling
from benchmarks.common import percentile, write_result
from benchmarks.retrieval_metrics import first_hits, metrics_for, paired_difference
from benchmarks.routing import ROUTED

RESULTS = Path(__file__).resolve().parent / "results"
STAGES = ("corpus", "ingest", "peer", "quality", "speed", "load", "scaling", "report")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def semantic_router_gate(ev: routing.Evaluation, questions: list[dict[str, str]]) -> dict[str, Any]:
    """semantic-router over moerag's training samples, calibrated on moerag's held-out samples."""
    from semantic_router import IndexedRouter, Route
    from semantic_router.encoders.local import LocalEncoder
    from sqlalchemy import select

    from app.core.models import Expert
    from engine.calibration import confidence_ece
    from engine.embedder import packaged_model_path

    rt = ev.rt
    with rt.sessions() as s:
        name_of: dict[int, str] = {i: n for i, n in s.execute(select(Expert.id, Expert.name))}
    # The very samples and split moerag's router trained and calibrated on.
    samples, calib, experts = rt.routers.labelled_samples()
    labelled = [(smp.text, name_of.get(e) if e is not None else None) for smp, e in zip(samples, experts, strict=True)]
    utterances: dict[str, list[str]] = {}
    for (text, name), held in zip(labelled, calib, strict=True):
        if name is not None and not held:
            utterances.setdefault(name, []).append(text)
    log(f"semantic-router: {sum(map(len, utterances.values()))} utterances over {len(utterances)} routes")
    t0 = time.perf_counter()
    encoder = LocalEncoder(name=str(packaged_model_path()), device="cpu")
    router = IndexedRouter(encoder=encoder, routes=[Route(name=n, utterances=u) for n, u in utterances.items()])
    held = [(t, n) for (t, n), h in zip(labelled, calib, strict=True) if h and n is not None]
    try:
        report = router.fit([t for t, _ in held], [n for _, n in held], method="platt")
        fit = {"accuracy": round(report.accuracy, 3), "ece": round(report.ece, 4), "n": report.n}
    except ValueError as exc:  # e.g. every held-out sample right: nothing to fit; raw scores stay
        fit = {"error": str(exc)}
    router.confidence_threshold = rt.settings.route_threshold
    build_s = time.perf_counter() - t0

    ranked, conf, correct, gate_ms = [], [], [], []
    for i, q in enumerate(questions):
        t = time.perf_counter()
        choices = router(q["question"], limit=None, threshold=0.0)
        gate_ms.append((time.perf_counter() - t) * 1000)
        assert isinstance(choices, list) and choices, "semantic-router returned no route"
        top = choices[0]
        conf.append(float(top.confidence or 0.0))
        correct.append(top.name == q["domain"])
        if conf[-1] >= rt.settings.route_threshold and top.name in ev.domain_clusters:
            hits = rt.indexes.index.search(ev.q_vecs[i : i + 1], 10, ev.domain_clusters[top.name])[1][0]
            ranked.append(ev.resolve(hits))
        else:
            ranked.append(ev.hybrid[i])  # the same fallback moerag takes
    c, ok = np.array(conf), np.array(correct, dtype=float)
    on = c >= rt.settings.route_threshold
    gate_ms.sort()
    return {
        "ranked": ranked,
        "router": {
            "accuracy": round(float(ok.mean()), 3),
            "ece_after": round(confidence_ece(torch.from_numpy(c), torch.from_numpy(ok)), 4),
            "fit_report": fit,
            "calibrated": router.calibrated,
            "expert_path_share": round(float(on.mean()), 3),
            "expert_path_accuracy": round(float(ok[on].mean()), 3) if on.any() else None,
            "gate_ms_p50": percentile(gate_ms, 50),
            "build_and_fit_seconds": round(build_s, 1),
        },
    }


def stage_quality(work: Path, corpus: Path, questions: list[dict[str, str]], latency_questions: int) -> dict[str, Any]:
    from app.core.settings import Settings
    from app.runtime import Runtime
    from benchmarks.embcache import EmbeddingCache, cached
    from benchmarks.reference import reference_ranked
    from engine.embedder import Embedder

    embedder = Embedder()
    cache = EmbeddingCache(work / "embeddings.sqlite", embedder)  # the plain reference's vectors, kept
    q_vecs = embedder.encode([q["question"] for q in questions])
    reference, _ = reference_ranked(corpus, cache, q_vecs)
    rt = Runtime(
        Settings(data_dir=work / "moerag", answer_cache=0), embedder=cached(embedder, cache)
    )  # latencies: no repeats served
    rt.start()
    try:
        ev = routing.evaluate(
            rt, questions, train=True, latency_questions=latency_questions, reference=reference, faq_blind=True
        )
        result = ev.result
        # The expert path probing only the nearest of its lists (MOERAG_EXPERT_NPROBE).
        from engine.pipeline import AskRequest

        result["expert_nprobe"] = {}
        for nprobe in sorted({0, 4, 8, 16} - {rt.settings.expert_nprobe}):
            rt.pipeline.config.expert_nprobe = nprobe
            preps = [rt.pipeline.prepare(AskRequest(q["question"], top_k=10)) for q in questions]
            name = f"routed, expert path probing {f'its {nprobe} nearest' if nprobe else 'all its'} lists"
            ev.ranked[name] = [[(c.chunk.text, c.chunk.source) for c in p.citations] for p in preps]
            scanned = [p.route.vectors_scanned for p in preps if p.route.path == "expert"]
            result["expert_nprobe"][nprobe] = {"expert_path_vectors_scanned_mean": round(float(np.mean(scanned)), 1)}
        rt.pipeline.config.expert_nprobe = rt.settings.expert_nprobe
        log("quality: LangChain FAISS retrieval ...")
        lc = peers.LangChainRetriever(work / "langchain")
        lc_ranked, lc_ms = [], []
        for q in questions:
            t = time.perf_counter()
            lc_ranked.append(lc.search(q["question"], 10))
            lc_ms.append((time.perf_counter() - t) * 1000)
        lc_ms.sort()
        ev.ranked["LangChain FAISS RAG (tutorial defaults)"] = lc_ranked
        result["peer_corpus"] = {"langchain_chunks": lc.size}
        log("quality: semantic-router as the gate ...")
        sr = semantic_router_gate(ev, questions)
        ev.ranked["moerag retrieval, semantic-router gate"] = sr.pop("ranked")
        result["retrieval"] = {name: metrics_for(r, questions) for name, r in ev.ranked.items()}
        # Is the routed pipeline's edge real? Paired bootstrap over the same questions.
        routed = first_hits(ev.ranked[ROUTED], questions)
        result["routed_minus"] = {
            name: paired_difference(routed, first_hits(r, questions)) for name, r in ev.ranked.items() if name != ROUTED
        }
        result["semantic_router"] = sr["router"]
        result["retrieval_latency_ms"] = {
            "moerag prepare (embed + route + retrieve), p50": result["prepare_latency_ms"]["p50"],
            "LangChain similarity_search (embed + exact search), p50": percentile(lc_ms, 50),
        }
    finally:
        rt.close()
    return result


def stage_speed(corpus: Path, pages: int) -> dict[str, Any]:
    """Ingestion of the same pages in one run: raw encodes bracket each pipeline (the machine drifts)."""
    from app.core.settings import Settings
    from app.runtime import Runtime
    from benchmarks.ingest import pipeline_texts, raw_encode
    from engine.embedder import Embedder

    files = evalcorpus.html_files(corpus)
    pick = files[:: max(1, len(files) // pages)][:pages]  # spread over every domain
    embedder = Embedder()
    m_texts = pipeline_texts(pick, embedder)
    lc_texts = [d.page_content for d in peers.load_split(pick, corpus)]
    log(f"speed: {len(pick)} pages → moerag {len(m_texts)} chunks, LangChain {len(lc_texts)} chunks")

    embedder.model.encode(m_texts[:64], batch_size=embedder.batch_size)  # warm-up
    raw_m = [raw_encode(embedder, m_texts)]
    raw_l = [raw_encode(embedder, lc_texts)]
    with tempfile.TemporaryDirectory() as tmp:
        rt = Runtime(Settings(data_dir=Path(tmp) / "data", admin_token="bench", answer_cache=0), embedder=embedder)
        rt.start()
        t = time.perf_counter()
        m_chunks = sum(o.chunks for o in rt.ingestor.ingest_many(evalcorpus.uploads(pick, corpus)))
        m_s = time.perf_counter() - t
        rt.close()
        lc_stats = peers.langchain_build(corpus, Path(tmp) / "lc", files=pick, progress=log)
    raw_m.append(raw_encode(embedder, m_texts))
    raw_l.append(raw_encode(embedder, lc_texts))
    lc_s = lc_stats["total_seconds"]

    def row(chunks: int, seconds: float, texts: list[str], raw_s: list[float]) -> dict[str, float]:
        raw_mean = sum(raw_s) / len(raw_s)
        return {
            "chunks": chunks,
            "seconds": round(seconds, 1),
            "pages_per_s": round(len(pick) / seconds, 2),
            "chunks_per_s": round(chunks / seconds, 1),
            "text_kchars_per_s": round(sum(map(len, texts)) / seconds / 1000, 1),
            "raw_encode_chunks_per_s": round(len(texts) / raw_mean, 1),
            "over_raw_encode": round(raw_mean / seconds * chunks / len(texts), 3),
        }

    return {
        "pages": len(pick),
        "moerag": row(m_chunks, m_s, m_texts, raw_m),
        "LangChain": row(lc_stats["chunks"], lc_s, lc_texts, raw_l),
        "moerag_over_langchain_pages_per_s": round(lc_s / m_s, 3),
        "dtype": embedder.dtype_name,
    }


def stage_scaling(work: Path, sizes: list[int], questions: list[dict[str, str]]) -> dict[str, Any]:
    queries = scaling.question_vectors([q["question"] for q in questions])
    return scaling.run(scaling.real_vectors(work / "moerag"), queries, sizes, [1, 4, 16, 64], log)


def plots(results: dict[str, Any], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    if "quality" in results:
        ret = results["quality"]["retrieval"]
        names = list(ret)
        fig, ax = plt.subplots(figsize=(9, 4.5))
        y = np.arange(len(names))
        ax.barh(y - 0.2, [ret[n]["hit@10"] for n in names], 0.4, label="hit@10")
        ax.barh(y + 0.2, [ret[n]["mrr@10"] for n in names], 0.4, label="MRR@10")
        ax.set_yticks(y, names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(f"FAQ dev ({results['quality']['corpus']['questions']} questions)")
        ax.set_xlim(0, 1)
        ax.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(out / "compare-quality.png", dpi=110)
        plt.close(fig)
        made.append("compare-quality.png")
    if "load" in results:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4))
        levels = results["load"]["levels"]
        for target in dict.fromkeys(r["target"] for r in levels):
            lv = [r for r in levels if r["target"] == target]
            xs = [r["clients"] for r in lv]
            ax.plot(xs, [r["p95_ms"] for r in lv], marker="o", label=target)
            ax2.plot(xs, [r["throughput_rps"] for r in lv], marker="s", label=target)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel("/ask p95 latency, ms")
        ax2.set_xlabel("concurrent clients")
        ax2.set_ylabel("throughput, req/s")
        ax.legend(fontsize=8)
        ax2.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "compare-load.png", dpi=110)
        plt.close(fig)
        made.append("compare-load.png")
    if "scaling" in results:
        rows = results["scaling"]["rows"]
        fig, ax = plt.subplots(figsize=(6, 4))
        for path in ("global", "expert path, all its lists", "expert path, nearest 16 of its lists", "IVF nprobe=16"):
            ax.plot([r["chunks"] for r in rows], [r.get(path, {}).get("ms") for r in rows], marker="o", label=path)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("chunks")
        ax.set_ylabel("ms per question (search only)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "compare-scaling.png", dpi=110)
        plt.close(fig)
        made.append("compare-scaling.png")
    return made


def markdown(results: dict[str, Any]) -> str:
    out = [f"Report: `{results.get('command', '')}`; each stage below names the command that measured it.", ""]
    if "quality" in results:
        q = results["quality"]
        out += [
            f"### Retrieval quality — FAQ dev ({q['corpus']['questions']} questions), "
            f"moerag {q['corpus']['chunks']:,} chunks / {q['corpus']['clusters']} clusters, "
            f"LangChain {q['peer_corpus']['langchain_chunks']:,} chunks",
            "",
            f"Command: `{results['quality'].get('command', '')}`",
            "",
            "| retrieval | hit@1 | hit@5 | hit@10 | MRR@10 | top-1 in the right domain |",
            "|---|---|---|---|---|---|",
        ]
        for name, m in q["retrieval"].items():
            out.append(f"| {name} | {m['hit@1']} | {m['hit@5']} | {m['hit@10']} | {m['mrr@10']} | {m['top1_domain']} |")
        out += [
            "",
            "Routed minus each other system, hit@10 over the same questions (95% paired bootstrap interval; "
            "questions only the routed pipeline finds / only the other finds):",
            "",
        ]
        for name, d in q.get("routed_minus", {}).items():
            out.append(f"- {name}: {d['diff']:+} [{d['ci95'][0]:+}, {d['ci95'][1]:+}] ({d['a_only']} / {d['b_only']})")
        r, s = q["router"], q["semantic_router"]
        out += [
            "",
            "| gate | domain accuracy | expert-path share (conf ≥ 0.7) | accuracy on the expert path | ECE "
            "| embed + gate ms p50 |",
            "|---|---|---|---|---|---|",
            f"| moerag router | {r['accuracy']} | {r['expert_path_share']} | {r['expert_path_accuracy']} "
            f"| {r['ece_after']} | {r['gate_ms_p50']} (gate alone {r['route_only_ms_p50']}) |",
            f"| semantic-router (Platt-fitted) | {s['accuracy']} | {s['expert_path_share']} "
            f"| {s['expert_path_accuracy']} | {s['ece_after']} | {s['gate_ms_p50']} |",
            "",
            f"Vectors scanned per question: {q['vectors_scanned']}. Retrieval latency in one process: "
            f"{q['retrieval_latency_ms']}.",
            "",
        ]
    if "speed" in results:
        sp = results["speed"]
        out += [
            f"### Ingestion — the same {sp['pages']} pages, one run",
            "",
            f"Command: `{results['speed'].get('command', '')}`",
            "",
            "| pipeline | chunks | pages/s | chunks/s | text kchars/s | raw encode chunks/s | share of raw encode |",
            "|---|---|---|---|---|---|---|",
        ]
        for name in ("moerag", "LangChain"):
            m = sp[name]
            out.append(
                f"| {name} | {m['chunks']} | {m['pages_per_s']} | {m['chunks_per_s']} | {m['text_kchars_per_s']} "
                f"| {m['raw_encode_chunks_per_s']} | {m['over_raw_encode']} |"
            )
        out.append("")
    if "load" in results:
        out += [
            "### /ask under load (one server process each, extractive generator, 127.0.0.1)",
            "",
            f"Command: `{results['load'].get('command', '')}`",
            "",
            "| target | clients | requests | req/s | p50 ms | p95 ms | p99 ms | load generator CPU |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for lv in results["load"]["levels"]:
            out.append(
                f"| {lv['target']} | {lv['clients']} | {lv['requests']} | {lv['throughput_rps']} "
                f"| {lv['p50_ms']} | {lv['p95_ms']} | {lv['p99_ms']} | {lv['loadgen_cpu_share']:.0%} |"
            )
        out.append("")
    if "scaling" in results:
        out += [
            "### Scaling (search only, one question at a time)",
            "",
            f"Command: `{results['scaling'].get('command', '')}`",
        ]
        out += ["", scaling.markdown(results["scaling"]), ""]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="where the corpus mirror and the indexes live")
    ap.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES))
    ap.add_argument("--corpus", type=Path, help="an already built corpus folder (default: WORK/corpus)")
    ap.add_argument("--questions", type=Path, help="default: ../shared/eval/faq-dev.jsonl")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--speed-pages", type=int, default=100)
    ap.add_argument("--load-requests", type=int, default=200)
    ap.add_argument("--load-seconds", type=float, default=60)
    ap.add_argument("--load-levels", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--load-targets", nargs="+", choices=[*load.MOERAG_TARGETS, *load.PEER_TARGETS])
    ap.add_argument("--latency-questions", type=int, default=100)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    args = ap.parse_args()

    work, res = args.work, args.results
    corpus = args.corpus or work / "corpus"
    work.mkdir(parents=True, exist_ok=True)
    res.mkdir(parents=True, exist_ok=True)
    questions = evalcorpus.load_questions(args.questions)
    command = " ".join(["python", *sys.argv])

    def save(stage: str, data: dict[str, Any]) -> None:
        data["command"] = command
        write_result(res / f"compare-{stage}.json", data)

    for stage in args.stages:
        log(f"stage {stage}")
        t = time.perf_counter()
        if stage == "corpus" and not args.corpus:
            log(f"corpus: {evalcorpus.build(corpus)}")
        elif stage == "ingest":
            log(f"ingest: {evalcorpus.ingest(corpus, work / 'moerag')}")
        elif stage == "peer":
            if (work / "langchain" / "index.faiss").exists():
                log("peer: LangChain store already built")
            else:
                log(f"peer: {peers.langchain_build(corpus, work / 'langchain', progress=log)}")
        elif stage == "quality":
            save("quality", stage_quality(work, corpus, questions, args.latency_questions))
        elif stage == "speed":
            save("speed", stage_speed(corpus, args.speed_pages))
        elif stage == "load":
            questions_text = [q["question"] for q in questions]
            save(
                "load",
                load.run(
                    work / "moerag",
                    args.load_levels,
                    args.load_seconds,
                    work / "load-server.log",
                    questions_text,
                    langchain=lc if (lc := work / "langchain").is_dir() else None,
                    requests=args.load_requests,
                    targets=args.load_targets,
                ),
            )
        elif stage == "scaling":
            save("scaling", stage_scaling(work, args.sizes, questions))
        elif stage == "report":
            merged: dict[str, Any] = {"command": command}
            for name in ("quality", "speed", "load", "scaling"):
                f = res / f"compare-{name}.json"
                if f.exists():
                    merged[name] = json.loads(f.read_text())
            merged["plots"] = plots(merged, res)
            write_result(res / "compare.json", merged)
            (res / "compare.md").write_text(markdown(merged))
            print(markdown(merged))
        log(f"stage {stage} done in {time.perf_counter() - t:.0f} s")


if __name__ == "__main__":
    main()
