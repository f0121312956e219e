"""What a shard holds and scans per question, with IVF-Flat (moerag's index) and compressed codes:
the measured figures behind the capacity plan in docs/capacity.md.

    python benchmarks/capacity.py --data-dir HELD_DIR/held-known

On the store's chunk vectors (the evaluation corpus: 46k) and the FAQ dev questions, in one
process, the lists trained as moerag trains them (`auto_cluster_count` lists, spherical k-means):

- per encoding (IVF-Flat float32; scalar quantizer 8 bit; product quantizer with m sub-vectors of
  8 bits, on residuals): bytes per vector in the index (codes + id), recall@10 against exact
  search over every list and over the 32 lists nearest the question (MOERAG_EXPERT_NPROBE's
  default), and the scan cost per vector in lists as long as a 50M store's (one thread, one
  question at a time);
- the projection of those figures to 50M and 1B chunks: √N lists, memory per encoding, the
  vectors a confident question scans (its 32 nearest lists of its expert) against an exact
  fallback (every vector) and a probed one, and the cores 500 questions/s need for the scan.

Results: benchmarks/results/capacity.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import faiss
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import write_result
from benchmarks.evalcorpus import load_questions
from benchmarks.scaling import real_vectors
from engine.embedder import Embedder
from index.clustering import auto_cluster_count, kmeans

RESULTS = Path(__file__).resolve().parent / "results"
K, NPROBE, RATE = 10, 32, 500
CHECK_LISTS = 8  # the route's check probes this many lists outside the expert (MOERAG_EXPERT_VERIFY_LISTS)
LIST_LENGTH = round(math.sqrt(50_000_000))
SIZES = {"50M": 50_000_000, "1B": 1_000_000_000}


def encodings(d: int) -> dict[str, Any]:
    """name -> a function (quantizer, nlist) -> an untrained IVF index of that encoding."""
    ip = faiss.METRIC_INNER_PRODUCT
    return {
        "ivf-flat (float32)": lambda qz, c: faiss.IndexIVFFlat(qz, d, c, ip),
        "ivf-sq8": lambda qz, c: faiss.IndexIVFScalarQuantizer(qz, d, c, faiss.ScalarQuantizer.QT_8bit, ip),
        "ivf-pq96 (m=96, 8 bit)": lambda qz, c: faiss.IndexIVFPQ(qz, d, c, 96, 8, ip),
        "ivf-pq48 (m=48, 8 bit)": lambda qz, c: faiss.IndexIVFPQ(qz, d, c, 48, 8, ip),
    }


def one_at_a_time(index: Any, q: np.ndarray, nprobe: int) -> float:
    """Seconds a question, one thread, one question at a time, `nprobe` lists."""
    index.nprobe = nprobe
    faiss.omp_set_num_threads(1)
    try:
        t = time.perf_counter()
        for row in q:
            index.search(row[None, :], K)
        return (time.perf_counter() - t) / len(q)
    finally:
        faiss.omp_set_num_threads(os.cpu_count() or 1)


def scan_cost(make: Any, x: np.ndarray, q: np.ndarray) -> float:
    """Seconds a vector scanned, in lists as long as a 50M store's (√50M ≈ 7,071 vectors): an
    index of this encoding with that few lists, every list scanned, one thread. Short lists
    cost more a vector (an IVF-PQ list's tables are built per list and question)."""
    n, d = x.shape
    nlist = max(1, round(n / LIST_LENGTH))
    quantizer = faiss.IndexFlatIP(d)
    quantizer.add(kmeans(x, nlist))
    index = make(quantizer, nlist)
    index.train(x)
    index.add(x)
    return one_at_a_time(index, q, nlist) / n


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / K for f, t in zip(found.tolist(), truth.tolist(), strict=True)]))


def measure(x: np.ndarray, q: np.ndarray, centroids: np.ndarray, truth: np.ndarray) -> dict[str, Any]:
    n, d = x.shape
    nlist = len(centroids)
    ids = np.arange(n, dtype=np.int64)
    out: dict[str, Any] = {}
    for name, make in encodings(d).items():
        quantizer = faiss.IndexFlatIP(d)
        quantizer.add(centroids)
        index = make(quantizer, nlist)
        index.train(x)  # the quantizer holds the lists already; this trains the codes
        index.add_with_ids(x, ids)
        size = len(faiss.serialize_index(index)) - nlist * d * 4  # the lists, not the centroids
        index.nprobe = nlist
        _, every = index.search(q, K)
        index.nprobe = NPROBE
        _, near = index.search(q, K)
        _, probe = quantizer.search(q, NPROBE)
        sizes = np.array([index.invlists.list_size(c) for c in range(nlist)])
        scanned = float(sizes[probe].sum(axis=1).mean())
        per_vector = scan_cost(make, x, q)
        out[name] = {
            "bytes_per_vector": round(size / n, 1),
            "recall@10_every_list": round(recall(every, truth), 3),
            f"recall@10_nprobe_{NPROBE}": round(recall(near, truth), 3),
            "vectors_scanned_per_question": round(scanned),
            "ns_per_vector_scanned": round(per_vector * 1e9, 2),
            "ms_per_question_at_nprobe_32_here": round(one_at_a_time(index, q, NPROBE) * 1e3, 3),
        }
        if name.startswith("ivf-pq96"):  # codes in memory, exact vectors read for the re-rank only
            refined = faiss.IndexRefineFlat(index, faiss.swig_ptr(x))
            refined.k_factor = 10
            index.nprobe = NPROBE
            _, near_refined = refined.search(q, K)
            out[name][f"recall@10_nprobe_{NPROBE}_reranked_{10 * K}_exact"] = round(recall(near_refined, truth), 3)
        print(name, out[name], flush=True)
    return out


def project(measured: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, n in SIZES.items():
        nlist = round(math.sqrt(n))
        routed = NPROBE * n / nlist  # a confident question: its 32 nearest lists inside its expert
        check = CHECK_LISTS * n / nlist  # ... and the route's check outside it
        row: dict[str, Any] = {
            "lists": nlist,
            "routed_vectors_scanned": round(routed),
            "check_vectors_scanned": round(check),
            "encodings": {},
        }
        for name, m in measured.items():
            ns = m["ns_per_vector_scanned"]
            row["encodings"][name] = {
                "memory_gib": round(n * m["bytes_per_vector"] / 2**30, 1),
                "routed_ms_one_core": round(routed * ns / 1e6, 2),
                "check_ms_one_core": round(check * ns / 1e6, 2),
                "exact_fallback_ms_one_core": round(n * ns / 1e6, 1),
                f"cores_for_{RATE}_routed_q_per_s_with_check": round(RATE * (routed + check) * ns / 1e9, 1),
                f"cores_for_{RATE}_exact_fallback_q_per_s": round(RATE * n * ns / 1e9, 0),
            }
        out[label] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True, help="a store: its chunk vectors are read (SQLite)")
    ap.add_argument("--name", default="capacity")
    args = ap.parse_args()
    x = np.ascontiguousarray(real_vectors(args.data_dir))  # [N, D]
    emb = Embedder()
    q = np.ascontiguousarray(emb.encode_questions([r["question"] for r in load_questions()]), dtype=np.float32)
    nlist = auto_cluster_count(len(x))
    rng = np.random.default_rng(0)
    centroids = kmeans(x[rng.choice(len(x), min(len(x), 256 * nlist), replace=False)], nlist)  # [C, D]
    exact = faiss.IndexFlatIP(x.shape[1])
    exact.add(x)
    _, truth = exact.search(q, K)  # [Q, K]
    measured = measure(x, q, centroids, truth)
    result = {
        "store": {"vectors": len(x), "dim": int(x.shape[1]), "lists": nlist, "questions": len(q)},
        "measured": measured,
        "projected": project(measured),
        "command": "python benchmarks/capacity.py --data-dir D"
        + (f" --name {args.name}" if args.name != "capacity" else ""),
    }
    RESULTS.mkdir(exist_ok=True)
    write_result(RESULTS / f"{args.name}.json", result)
    print(json.dumps(result["projected"], indent=2))


RESULTS = Path(__file__).resolve().parent / "results"


def measure_codec(data_dir: Path, codec: str, questions: list[dict[str, str]]) -> dict[str, Any]:
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


def codec_main(argv: list[str]) -> None:
    """`codec`: the index's codec on the evaluation store: FAQ dev hit@10 routed and on the fallback (global
    hybrid), the index's bytes and the time a question takes, flat against sq8, in one run.

        python benchmarks/capacity.py codec --data-dir D    # results: benchmarks/results/codec.json

    The store is opened once with each `MOERAG_INDEX_CODEC` (an sq8 opening rebuilds the index from
    SQL's float32 embeddings: the answer scores then come from the codes), and the 174 dev questions
    are asked through the served pipeline (k=10), each way in turn, twice; the second pass is timed.
    `recall@10` is the sq8 index's top 10 for each dev question's embedding, every list searched,
    against the float32 index's (exact: every list of IVF-Flat is a flat search).
    """
    ap = argparse.ArgumentParser(
        prog="capacity.py codec", description=codec_main.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data-dir", type=Path, required=True, help="a copy of the evaluation store (it is rewritten)")
    ap.add_argument("--name", default="codec")
    args = ap.parse_args(argv)
    from benchmarks.evalcorpus import load_questions

    questions = load_questions()
    result: dict[str, Any] = {
        "command": "python benchmarks/capacity.py codec " + " ".join(sys.argv[1:]),
        "questions": len(questions),
    }
    for codec in ("flat", "sq8"):
        result[codec] = measure_codec(args.data_dir, codec, questions)
        print(codec, json.dumps({k: v for k, v in result[codec].items() if k != "top10"}), flush=True)
    exact, coded = result["flat"].pop("top10"), result["sq8"].pop("top10")
    overlap = [len(set(a) & set(b)) / 10 for a, b in zip(exact, coded, strict=True)]
    result["sq8"]["recall@10"] = round(sum(overlap) / len(overlap), 4)
    RESULTS.mkdir(exist_ok=True)
    write_result(RESULTS / f"{args.name}.json", result)


if __name__ == "__main__":
    if sys.argv[1:2] == ["codec"]:
        codec_main(sys.argv[2:])
    else:
        main()
