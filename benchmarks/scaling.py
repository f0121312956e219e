"""How query latency, recall and memory grow with the corpus: expert path vs global vs plain IVF.

    python benchmarks/scaling.py --data-dir /tmp/evaldata                 # 10k, 100k, 1M chunks
    python benchmarks/scaling.py --data-dir /tmp/evaldata --sizes 10000   # quicker

Vectors: the real chunk embeddings of an ingested data dir (the eval corpus: 56,547), and
beyond that jittered copies of them (each a real vector plus Gaussian noise, renormalised, cosine
≈ 0.9 to its source) so the topic structure holds at 1M. Without a data dir: topic-clustered
synthetic vectors. Queries are the FAQ dev questions, embedded. Per size, one process:

- the index is built the way moerag builds it (`auto_cluster_count` lists, spherical k-means on
  a sample, IVFFlat inner product) and its lists are grouped into 6 experts by k-means over the
  centroids (what `propose` does);
- **global** = every list (exact); **expert path** = the lists of the expert owning the query's
  nearest centroid (a stand-in for the router, whose cost does not grow with N), all of them or
  only the 16 / 64 nearest the question (`MOERAG_EXPERT_NPROBE`); **IVF nprobe=p** = the p
  nearest lists of the whole index;
- recall@10 against the exact top 10, median latency per single question, vectors scanned,
  index bytes and the process RSS after building.
"""

from __future__ import annotations

import argparse
import resource
import sqlite3
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import write_result
from index import ClusteredIndex
from index.clustering import auto_cluster_count, kmeans

RESULTS = Path(__file__).resolve().parent / "results"
D, EXPERTS, K = 384, 6, 10
Floats = npt.NDArray[np.float32]


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def real_vectors(data_dir: Path | None) -> Floats:
    if data_dir is None:
        return np.zeros((0, D), dtype=np.float32)
    con = sqlite3.connect(f"file:{data_dir / 'moerag.db'}?mode=ro", uri=True)
    blobs = [r[0] for r in con.execute("SELECT embedding FROM chunk ORDER BY id")]
    con.close()
    return np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(blobs), D)


def corpus(n: int, base: Floats, rng: np.random.Generator) -> Floats:
    """[n, D] unit vectors: the real ones first, then jittered copies (or synthetic topics)."""
    if len(base) == 0:
        topics = rng.standard_normal((64, D)).astype(np.float32)
        base = topics[rng.integers(0, 64, 4096)] + 0.6 * rng.standard_normal((4096, D)).astype(np.float32)
        base /= np.linalg.norm(base, axis=1, keepdims=True)
    parts = [base[:n]]
    left = n - len(parts[0])
    while left > 0:
        m = min(left, 200_000)
        src = base[rng.integers(0, len(base), m)]
        # Noise scale: per-coordinate σ=0.025 over 384 dims gives |noise| ≈ 0.49, cosine ≈ 0.9.
        y = src + rng.normal(0, 0.025, (m, D)).astype(np.float32)
        parts.append(y / np.linalg.norm(y, axis=1, keepdims=True))
        left -= m
    return np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)


def timed(fn: Any, count: int) -> tuple[float, list[Any]]:
    """Median ms per single question (fn(i) answers question i), and each question's result."""
    out, times = [], []
    fn(0)  # warm-up
    for i in range(count):
        t = time.perf_counter()
        out.append(fn(i))
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times), out


def recall(found: list[Any], truth: list[Any]) -> float:
    return float(np.mean([len(set(f.tolist()) & set(t.tolist())) / K for f, t in zip(found, truth, strict=True)]))


def row(
    n: int, base: Floats, queries: Floats, nprobes: list[int], expert_caps: tuple[int, ...] = (16, 64), seed: int = 0
) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    rss0 = rss_mib()
    x = corpus(n, base, rng)  # [N, D]
    nlist = auto_cluster_count(n)
    t = time.perf_counter()
    train = x[rng.choice(n, min(n, 256 * nlist), replace=False)]
    centroids = kmeans(train, nlist)  # [C, D]
    train_s = time.perf_counter() - t
    idx = ClusteredIndex.create(centroids, "scaling")
    t = time.perf_counter()
    idx.add(x, np.arange(n, dtype=np.int64), idx.assign(x))
    add_s = time.perf_counter() - t
    rss = rss_mib()  # before serialising: the copy to_bytes makes would inflate it
    index_bytes = len(idx.to_bytes())
    del x
    sizes = idx.list_sizes()  # [C]
    expert_of = np.zeros(nlist, dtype=np.int64)  # [C] expert per list, as `propose` groups them
    if nlist >= EXPERTS:
        groups = kmeans(centroids, EXPERTS)
        expert_of = (centroids @ groups.T).argmax(1)
    lists_of = [np.flatnonzero(expert_of == e) for e in range(EXPERTS)]
    nearest = (queries @ centroids.T).argmax(1)  # [Q] the query's nearest list
    order = np.argsort(-(queries @ centroids.T), axis=1)  # [Q, C]

    nq = len(queries)
    glob_ms, truth = timed(lambda i: idx.search(queries[i : i + 1], K)[1][0], nq)
    exp_ms, exp_found = timed(lambda i: idx.search(queries[i : i + 1], K, lists_of[expert_of[nearest[i]]])[1][0], nq)
    scanned_expert = float(np.mean([sizes[lists_of[expert_of[c]]].sum() for c in nearest]))
    result: dict[str, Any] = {
        "chunks": n,
        "lists": nlist,
        "kmeans_train_s": round(train_s, 1),
        "add_s": round(add_s, 1),
        "index_mib": round(index_bytes / 2**20, 1),
        "rss_after_build_mib": round(rss, 0),
        "rss_growth_mib": round(rss - rss0, 0),
        "global": {"ms": round(glob_ms, 3), "recall@10": 1.0, "scanned": int(sizes.sum())},
        "expert path, all its lists": {
            "ms": round(exp_ms, 3),
            "recall@10": round(recall(exp_found, truth), 3),
            "scanned": round(scanned_expert, 0),
        },
    }
    # The expert path capped to the nearest lists of its scope (MOERAG_EXPERT_NPROBE).
    for cap in expert_caps:

        def capped(i: int, cap: int = cap) -> Any:  # choosing the lists is part of the timed work
            return idx.search(
                queries[i : i + 1], K, idx.nearest_lists(queries[i], lists_of[expert_of[nearest[i]]], cap)
            )

        ms, found = timed(lambda i: capped(i)[1][0], nq)
        probe = [idx.nearest_lists(queries[i], lists_of[expert_of[nearest[i]]], cap) for i in range(nq)]
        result[f"expert path, nearest {cap} of its lists"] = {
            "ms": round(ms, 3),
            "recall@10": round(recall(found, truth), 3),
            "scanned": round(float(np.mean([sizes[p].sum() for p in probe])), 0),
        }
    # Plain IVF given the (uncapped) expert path's scan budget: the nearest lists until as many vectors.
    cum = np.cumsum(sizes[order], axis=1)  # [Q, C]
    budget_probe = [int(np.searchsorted(c, scanned_expert) + 1) for c in cum]
    ms, found = timed(lambda i: idx.search(queries[i : i + 1], K, order[i, : budget_probe[i]])[1][0], nq)
    result["IVF, expert path's scan budget"] = {
        "ms": round(ms, 3),
        "recall@10": round(recall(found, truth), 3),
        "scanned": round(float(np.mean([c[min(p, nlist) - 1] for c, p in zip(cum, budget_probe, strict=True)])), 0),
        "nprobe_mean": round(float(np.mean(budget_probe)), 1),
    }
    for p in sorted({p for p in nprobes if p <= nlist}):
        ms, found = timed(lambda i, p=p: idx.search(queries[i : i + 1], K, order[i, :p])[1][0], nq)
        scanned = float(np.mean([sizes[o[:p]].sum() for o in order]))
        result[f"IVF nprobe={p}"] = {
            "ms": round(ms, 3),
            "recall@10": round(recall(found, truth), 3),
            "scanned": round(scanned, 0),
        }
    return result


def question_vectors(questions: list[str]) -> Floats:
    from engine.embedder import Embedder

    return Embedder().encode(questions)


def run(base: Floats, queries: Floats, sizes: list[int], nprobes: list[int], progress: Any = print) -> dict[str, Any]:
    """One row per corpus size, in this process (so the ratios between paths hold)."""
    rows = []
    for n in sizes:
        progress(f"scaling: {n} chunks ...")
        rows.append(row(n, base, queries, nprobes))
    return {"rows": rows, "real_vectors": len(base)}


def main() -> None:
    from benchmarks.evalcorpus import load_questions

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, help="an ingested data dir whose embeddings seed the corpus")
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--nprobe", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--questions", type=int, default=174)
    ap.add_argument("--out", type=Path, default=RESULTS / "scaling.json")
    args = ap.parse_args()

    queries = question_vectors([q["question"] for q in load_questions()][: args.questions])
    out = run(real_vectors(args.data_dir), queries, args.sizes, args.nprobe, lambda m: print(m, flush=True))
    out["command"] = " ".join(["python", *sys.argv])
    args.out.parent.mkdir(exist_ok=True)
    write_result(args.out, out)
    print(markdown(out))


def markdown(out: dict[str, Any]) -> str:
    lines = [
        "| chunks | lists | path | ms / question | recall@10 | vectors scanned | index MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in out["rows"]:
        for name, m in r.items():
            if isinstance(m, dict):
                cells = [f"{r['chunks']:,}", r["lists"], name, m["ms"], m["recall@10"], f"{int(m['scanned']):,}"]
                lines.append("| " + " | ".join(str(c) for c in [*cells, r["index_mib"]]) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
