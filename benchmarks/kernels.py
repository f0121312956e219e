"""Kernel timings: torch twin vs FAISS for expert-scoped search on CPU; Triton vs torch on a GPU.

    python benchmarks/kernels.py                    # CPU: 10k, 100k, 1M chunks
    python benchmarks/kernels.py --sizes 10000      # quicker
    python benchmarks/kernels.py --gpu              # also Triton vs torch on CUDA (needs a GPU)

Layout: N chunks of dimension 384 in E=8 equal experts; each query searches one expert (N/8
vectors), top 10. FAISS gets the same work: an IVF index with one inverted list per expert and
`search_preassigned` on the query's list. Medians of repeated runs, all in one process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import faiss
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import write_result
from index import ClusteredIndex
from kernels.gate_topk import gate_topk_torch, gate_topk_triton
from kernels.scoped_search import scoped_search_torch, scoped_search_triton

D, E, K = 384, 8, 10


def median_ms(fn: Callable[[], object], repeat: int, sync: Callable[[], None] = lambda: None) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def data(n: int, q: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, D), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    queries = rng.standard_normal((q, D), dtype=np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    expert_of = np.repeat(np.arange(E), n // E + 1)[:n]  # [N] contiguous segments
    offsets = np.searchsorted(expert_of, np.arange(E + 1)).astype(np.int64)  # [E+1]
    return x, queries, expert_of, offsets


def cpu_row(n: int, q: int, repeat: int) -> dict[str, object]:
    x, queries, expert_of, offsets = data(n, q)
    idx = ClusteredIndex.create(np.eye(E, D, dtype=np.float32), "bench")
    idx.add(x, np.arange(n, dtype=np.int64), expert_of.astype(np.int64))
    xt, qt, ot = torch.from_numpy(x), torch.from_numpy(queries), torch.from_numpy(offsets)
    sel = torch.full((q, 1), 3, dtype=torch.int64)
    faiss_ms = median_ms(lambda: idx.search(queries, K, [3]), repeat)
    twin_ms = median_ms(lambda: scoped_search_torch(xt, qt, ot, sel, K), repeat)
    _, f_ids = idx.search(queries, K, [3])
    _, t_rows = scoped_search_torch(xt, qt, ot, sel, K)
    agree = float(np.mean([len(set(a) & set(b)) / K for a, b in zip(f_ids, t_rows.numpy(), strict=True)]))
    return {
        "chunks": n,
        "queries": q,
        "scanned_per_query": n // E,
        "faiss_ms": round(faiss_ms, 3),
        "torch_twin_ms": round(twin_ms, 3),
        "twin_over_faiss": round(twin_ms / faiss_ms, 2),
        "top10_agreement": round(agree, 3),
    }


def gpu_scoped_row(n: int, q: int, repeat: int) -> dict[str, object]:
    sync = torch.cuda.synchronize
    x, queries, _, offsets = data(n, q)
    xt, qt = torch.from_numpy(x).cuda(), torch.from_numpy(queries).cuda()
    ot = torch.from_numpy(offsets).cuda()
    sel = torch.full((q, 1), 3, dtype=torch.int64, device="cuda")
    tri = median_ms(lambda: scoped_search_triton(xt, qt, ot, sel, K), repeat, sync)
    twin = median_ms(lambda: scoped_search_torch(xt, qt, ot, sel, K), repeat, sync)
    a, b = scoped_search_triton(xt, qt, ot, sel, K)[1], scoped_search_torch(xt, qt, ot, sel, K)[1]
    return {
        "op": "scoped_search",
        "chunks": n,
        "queries": q,
        "triton_ms": round(tri, 3),
        "torch_ms": round(twin, 3),
        "same_ids": bool(torch.equal(a, b)),
    }


def gpu_gate_row(qn: int, e: int, repeat: int) -> dict[str, object]:
    sync = torch.cuda.synchronize
    logits = torch.randn(qn, e, device="cuda")
    tri = median_ms(lambda: gate_topk_triton(logits, 0.8, 2, True), repeat, sync)
    twin = median_ms(lambda: gate_topk_torch(logits, 0.8, 2, True), repeat, sync)
    return {"op": "gate_topk", "queries": qn, "experts": e, "triton_ms": round(tri, 4), "torch_ms": round(twin, 4)}


def run_rows(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    for row in rows:
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--queries", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    faiss.omp_set_num_threads(torch.get_num_threads())
    result: dict[str, object] = {"cpu": run_rows([cpu_row(n, args.queries, args.repeat) for n in args.sizes])}
    if args.gpu:
        if not torch.cuda.is_available():
            raise SystemExit("--gpu: no CUDA device")
        gpu = [gpu_scoped_row(n, args.queries, args.repeat) for n in args.sizes]
        gpu += [gpu_gate_row(qn, e, args.repeat) for qn, e in ((1, 8), (1024, 64), (4096, 257))]
        result["gpu"] = run_rows(gpu)
    if args.json:
        write_result(args.json, result)


if __name__ == "__main__":
    main()
