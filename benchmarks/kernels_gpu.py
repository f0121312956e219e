"""The kernels on a CUDA GPU (issue table of `benchmarks/gpu_check.sh`): needs only torch, Triton,
numpy and (for the embedding row) sentence-transformers, as the GPU machine has them.

    python benchmarks/kernels_gpu.py --json benchmarks/results/kernels-gpu.json

Layout: N chunks of 384 dimensions in E=8 equal experts, each query searches one expert (query q:
expert q mod 8), top R. Per row, milliseconds a call (`triton.testing.do_bench`, median):

- `split`: the shipped kernel (kernels.scoped_split); `serial`: the first kernel (one program a
  query and expert), left out where it would take seconds;
- `twin`: the torch twin (the oracle); `plain_torch`: one `queries @ x[seg].T` per expert and
  `torch.topk` (the bar: `split` at one query must take at most a third of it at 1M);
- `floor`: the bytes the queries' experts hold, read once, at the bandwidth a device-to-device
  copy reaches here;
- `same_ids_as_twin` (float32 stores) and `top10_vs_fp32_exact` (half-precision stores: agreement
  of the top 10 with an exact float32 search).

Then the gate kernel against its twin, and moerag's embedder: passages a second on the GPU, one question's
time on the GPU and on the CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import write_result
from kernels.gate_topk import gate_topk_torch, gate_topk_triton
from kernels.scoped_search import scoped_search_torch, scoped_search_triton, scoped_search_triton_serial

D, E = 384, 8
ROWS = [  # (chunks, store dtype, queries, R)
    (100_000, "fp32", 1, 10),
    (1_000_000, "fp32", 1, 10),
    (1_000_000, "fp32", 1, 50),
    (1_000_000, "fp16", 1, 10),
    (1_000_000, "fp16", 1, 50),
    (1_000_000, "fp32", 64, 10),
    (1_000_000, "fp32", 1024, 10),
    (1_000_000, "fp16", 64, 10),
    (1_000_000, "fp16", 1024, 10),
    (10_000_000, "fp32", 1, 10),
    (10_000_000, "fp16", 1, 10),
    (10_000_000, "fp16", 1, 50),
    (10_000_000, "fp16", 64, 10),
    (10_000_000, "fp16", 1024, 10),
    (10_000_000, "fp32", 64, 10),
]
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


DEVICE = "cuda"  # --smoke: "cpu", under the Triton interpreter, to check this script off the GPU


def ms(fn: Callable[[], object]) -> float:
    if DEVICE == "cpu":
        t = time.perf_counter()
        fn()
        return round((time.perf_counter() - t) * 1000, 4)
    return round(float(triton.testing.do_bench(fn, warmup=10, rep=50)), 4)


def bandwidth_gb_s() -> float:
    """Device memory bandwidth a large copy reaches (read + write), GB/s."""
    a = torch.empty(2**28 if DEVICE == "cuda" else 2**20, dtype=torch.float32, device=DEVICE)  # 1 GiB
    b = torch.empty_like(a)
    took = ms(lambda: b.copy_(a))
    return round(2 * a.numel() * 4 / (took / 1000) / 1e9, 1)


def plain_torch(x: torch.Tensor, q: torch.Tensor, offsets: list[int], experts: torch.Tensor, r: int) -> object:
    out = []
    for e in range(E):
        sel = (experts[:, 0] == e).nonzero().flatten()
        if len(sel):
            seg = x[offsets[e] : offsets[e + 1]]
            out.append(torch.topk((q[sel].to(x.dtype) @ seg.T).float(), min(r, len(seg)), dim=1))
    return out


def row(x32: torch.Tensor, store: str, n_q: int, r: int, gb_s: float) -> dict[str, Any]:
    n = x32.shape[0]
    x = x32 if store == "fp32" else x32.to(DTYPES[store])
    offsets = [round(n * e / E) for e in range(E + 1)]
    off = torch.tensor(offsets, device=DEVICE)
    g = torch.Generator(device=DEVICE).manual_seed(n_q)
    q = torch.nn.functional.normalize(torch.randn(n_q, D, device=DEVICE, generator=g), dim=1)
    experts = (torch.arange(n_q, device=DEVICE) % E)[:, None]  # [Q, 1]
    scanned = len(set(experts[:, 0].tolist())) * (n // E) * x.element_size() * D  # each expert read once
    out: dict[str, Any] = {"chunks": n, "store": store, "queries": n_q, "R": r}
    out["split_ms"] = ms(lambda: scoped_search_triton(x, q, off, experts, r))
    if n_q * n <= 64 * 1_000_000:
        out["serial_ms"] = ms(lambda: scoped_search_triton_serial(x, q, off, experts, r))
    if n_q <= 64:
        out["twin_ms"] = ms(lambda: scoped_search_torch(x, q, off, experts, r))
    out["plain_torch_ms"] = ms(lambda: plain_torch(x, q, offsets, experts, r))
    out["floor_ms"] = round(scanned / (gb_s * 1e9) * 1000, 4)
    out["split_over_plain"] = round(out["split_ms"] / out["plain_torch_ms"], 3)
    out["split_over_floor"] = round(out["split_ms"] / out["floor_ms"], 2)
    got = scoped_search_triton(x, q, off, experts, r)[1]
    if store == "fp32" and n_q <= 64:
        out["same_ids_as_twin"] = bool(torch.equal(got, scoped_search_torch(x, q, off, experts, r)[1]))
    if store != "fp32":
        exact = scoped_search_torch(x32, q, off, experts, 10)[1]
        agree = [len(set(a) & set(b)) / 10 for a, b in zip(got[:, :10].tolist(), exact.tolist(), strict=True)]
        out["top10_vs_fp32_exact"] = round(sum(agree) / len(agree), 4)
    print(json.dumps(out), flush=True)
    return out


def gate_rows() -> list[dict[str, Any]]:
    rows = []
    for n_q, e in ((1, 8), (1024, 64), (4096, 257)):
        logits = torch.randn(n_q, e, device=DEVICE)
        tri = ms(partial(gate_topk_triton, logits, 0.8, 2, True))
        twin = ms(partial(gate_topk_torch, logits, 0.8, 2, True))
        rows.append(
            {
                "op": "gate_topk",
                "queries": n_q,
                "experts": e,
                "triton_ms": tri,
                "torch_ms": twin,
                "twin_over_triton": round(twin / tri, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def embedding_row() -> dict[str, Any]:
    """moerag's embedder as it serves (engine.embedder.Embedder): passages a second on this device
    (float16/bfloat16, batches of 256 on a GPU), and one question's time here and on the CPU, each
    with its compiled question model (whether questions belong on the GPU too)."""
    import os
    import statistics

    from engine.embedder import Embedder, packaged_model_path

    try:
        path = os.environ.get("MOERAG_MODEL_PATH") or packaged_model_path()  # gpu_check.sh: the carried copy
    except ImportError as exc:  # the model package is not installed on this machine
        return {"op": "embed", "skipped": repr(exc)}
    sync = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
    model = Embedder(path, device=DEVICE)
    passages = [("moerag answers questions over a team's own documents with an expert per topic. " * 12)] * (
        2048 if DEVICE == "cuda" else 64
    )
    model.encode(passages[:256])
    sync()
    t = time.perf_counter()
    model.encode(passages)
    sync()
    out: dict[str, Any] = {
        "op": "embed",
        "dtype": model.dtype_name,
        "batch": model.batch_size,
        "passages_per_s": round(len(passages) / (time.perf_counter() - t), 1),
    }
    questions = [f"How do I undo commit number {n} but keep my changes?" for n in range(40)]
    for where, embedder in ((DEVICE, model), ("cpu", Embedder(path, device="cpu"))):
        out[f"question_model_{where}"] = embedder.compile_questions("auto")
        ms_each = []
        for q in questions:
            t = time.perf_counter()
            embedder.encode_questions([q])
            sync()
            ms_each.append((time.perf_counter() - t) * 1000)
        out[f"one_question_ms_p50_{where}"] = round(statistics.median(ms_each[5:]), 2)
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--max-chunks", type=int, default=10_000_000)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (TRITON_INTERPRET=1): the script runs")
    args = ap.parse_args()
    global DEVICE, ROWS
    if args.smoke:
        DEVICE = "cpu"
        ROWS = [(n // 500, store, min(q, 20), r) for n, store, q, r in ROWS[:9]]
    elif not torch.cuda.is_available():
        raise SystemExit("no CUDA device")
    from kernels import backend

    backend.configure("triton")
    gb_s = bandwidth_gb_s()
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (smoke)"
    result: dict[str, Any] = {"device": name, "copy_bandwidth_gb_s": gb_s, "scoped": []}
    by_size: dict[int, torch.Tensor] = {}
    for n, store, n_q, r in ROWS:
        if n > args.max_chunks:
            continue
        if n not in by_size:
            by_size.clear()
            torch.cuda.empty_cache()
            by_size[n] = torch.nn.functional.normalize(torch.randn(n, D, device=DEVICE), dim=1)
        result["scoped"].append(row(by_size[n], store, n_q, r, gb_s))
        write_result(args.json, result)  # what ran so far, if the time runs out
    by_size.clear()
    result["gate"] = gate_rows()
    result["embedding"] = embedding_row()
    write_result(args.json, result)


if __name__ == "__main__":
    main()
