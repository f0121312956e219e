"""The ask pipeline on a GPU against the CPU service, on the same store and the same question vectors.

    python benchmarks/gpu_pipeline.py prepare            # here: .gpu-carry/pipeline (the pydoc sample store)
    python benchmarks/gpu_pipeline.py check --json F     # on the GPU machine (benchmarks/gpu_check.sh)

`prepare` runs where the whole stack is installed. It opens a store (the pydoc sample, built on
first use, or `--data-dir`), embeds a spread of questions once (float32, on the CPU) and asks each
of them three ways through the served pipeline with the CPU service's state (FAISS searches the
expert path): as served (mode auto), forced to its gate's top expert, and on the fallback. It
writes what the GPU side needs to rebuild that state without SQL: the index (FAISS bytes), the
router, the experts, the BM25 index, the chunk records, the expert-sorted float32 matrix, the
question vectors and the CPU's answers.

`check` needs only the engine, FAISS, bm25s and torch (gpu_check.sh installs the carried wheels).
It rebuilds the state with the matrix on the GPU in float32 and the Triton backend (the gate
kernel and the scoped kernel serve the question), asks the same questions the same three ways,
and compares: route, expert and cited ids equal, scores within 1e-4. The question vectors are
the CPU's, so the check isolates the GPU's part of the question path; the embedder's own GPU
check is tests/kernels/test_gpu.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pickle
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import write_result

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / ".gpu-carry" / "pipeline"
TOP_K = 10
MODES: tuple[str, ...] = ("auto", "expert", "fallback")


class Records:
    """The chunk store of the bundle: every chunk's record, in memory (engine.pipeline.ChunkStore)."""

    def __init__(self, records: dict[int, Any]) -> None:
        self.records = records

    def fetch(self, ids: Any) -> dict[int, Any]:
        return {i: self.records[i] for i in ids if i in self.records}


def questions_of(records: dict[int, Any], n: int) -> list[str]:
    """n questions spread over the store: the opening words of every (len/n)-th chunk."""
    ids = sorted(records)
    picked = [ids[round(j * (len(ids) - 1) / max(n - 1, 1))] for j in range(n)]
    return [" ".join(records[i].text.split()[:14]) for i in picked]


def ask_all(pipeline: Any, questions: list[str], vectors: np.ndarray) -> tuple[list[dict[str, Any]], list[float]]:
    """Every question three ways (MODES) -> (answers, ms a question as served); the expert mode
    is forced to the expert the served ask's gate put first (none: skipped)."""
    from engine.pipeline import AskRequest
    from engine.question_encoder import done_future

    by_text = {q: vectors[j : j + 1] for j, q in enumerate(questions)}
    pipeline.submit_question = lambda text, alone: done_future(by_text[text])
    out, ms = [], []
    for q in questions:
        t = time.perf_counter()
        served = pipeline.prepare(AskRequest(q, top_k=TOP_K))
        ms.append((time.perf_counter() - t) * 1000)
        top = next((e.id for e, _ in served.route.top if e is not None), None)
        asks = {"auto": served, "fallback": pipeline.prepare(AskRequest(q, top_k=TOP_K, mode="fallback"))}
        if top is not None:
            asks["expert"] = pipeline.prepare(AskRequest(q, top_k=TOP_K, mode="expert", expert_id=top))
        for mode, p in asks.items():
            out.append(
                {
                    "question": q,
                    "mode": mode,
                    "path": p.route.path,
                    "reason": p.route.reason,
                    "expert": p.route.expert.id if p.route.expert is not None else None,
                    "ids": [c.chunk.id for c in p.citations],
                    "scores": [round(c.score, 6) for c in p.citations],
                }
            )
    return out, ms


def same_answer(want: dict[str, Any], got: dict[str, Any], atol: float = 1e-4) -> bool:
    """The same route and expert, the same scores (within atol) and the same ids, where chunks of
    equal score may come in another order (FAISS orders ties by scan, the kernels by id) and the
    last place's tie may be broken by another of them."""
    if (want["path"], want["expert"]) != (got["path"], got["expert"]) or len(want["ids"]) != len(got["ids"]):
        return False
    ws, gs = np.asarray(want["scores"]), np.asarray(got["scores"])
    if not np.allclose(ws, gs, atol=atol):
        return False
    for j in range(len(ws)):
        tied = np.abs(ws - ws[j]) <= atol  # [k] the places sharing this score
        if tied[-1]:  # the cut falls inside this tie: any of the tied chunks may take its places
            break
        if {want["ids"][t] for t in np.flatnonzero(tied)} != {got["ids"][t] for t in np.flatnonzero(tied)}:
            return False
    return True


def prepare(data_dir: Path, n: int) -> None:
    from app.cli.sample import ensure_sample, store_is_empty
    from app.core.settings import Settings
    from app.runtime import Runtime

    settings = Settings(
        data_dir=data_dir,
        scoped_search="kernel",
        matrix_dtype="float32",
        question_cache=0,
        answer_cache=0,
        kernel_backend="torch",
    )
    if store_is_empty(settings):
        ensure_sample(settings)
    rt = Runtime(settings)
    rt.start(run_jobs=False)
    try:
        state, matrix = rt.state(), rt.state().matrix
        assert matrix is not None
        ids, _ = state.index.assignments()
        records = rt.pipeline.store.fetch(ids.tolist())
        questions = questions_of(records, n)
        vectors = rt.embedder.encode(questions).astype(np.float32)  # [n, D]
        cpu = dataclasses.replace(state, matrix=None)  # the CPU service: FAISS searches the expert path
        from engine.pipeline import AskPipeline

        pipeline = AskPipeline(
            embedder=rt.embedder,
            state=lambda: cpu,
            store=Records(records),
            generator=rt.generators,
            config=rt.pipeline.config,
        )
        expected, _ = ask_all(pipeline, questions, vectors)
        router = state.router
        assert router is not None
        bundle = {
            "experts": dict(state.experts),
            "lexical": state.lexical,
            "records": records,
            "config": rt.pipeline.config,
            "questions": questions,
            "vectors": vectors,
            "expected": expected,
            "router": {
                "state": router.state_bytes(),
                "dim": router.net.dim,
                "hidden": router.net.hidden,
                "expert_ids": router.expert_ids,
                "temperature": router.temperature,
                "version_id": router.version_id,
            },
            "index_version": state.index.version,
            "matrix": {
                "ids": matrix.ids.numpy(),
                "x": matrix.x.numpy(),
                "offsets": matrix.offsets.numpy(),
                "expert_ids": matrix.expert_ids,
            },
        }
    finally:
        rt.close()
    BUNDLE.mkdir(parents=True, exist_ok=True)
    (BUNDLE / "index.faiss").write_bytes(state.index.serialized())
    (BUNDLE / "bundle.pkl").write_bytes(pickle.dumps(bundle, protocol=pickle.HIGHEST_PROTOCOL))
    size = sum(f.stat().st_size for f in BUNDLE.iterdir())
    paths = {p: sum(a["path"] == p for a in expected) for p in ("expert", "fallback")}
    print(
        f"{BUNDLE}: {len(records)} chunks, {len(questions)} questions, answers by path {paths}, {size / 2**20:.1f} MiB"
    )


def check(out: Path, device: str) -> None:
    import torch

    from engine.expert_matrix import ExpertMatrix
    from engine.generators import ExtractiveGenerator
    from engine.pipeline import AskPipeline
    from engine.router import Router
    from engine.serving import ServingState
    from index import ClusteredIndex
    from kernels import backend
    from kernels.scoped_search import scoped_search_triton

    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device")
    backend.configure("triton")
    b = pickle.loads((BUNDLE / "bundle.pkl").read_bytes())
    index = ClusteredIndex.from_bytes((BUNDLE / "index.faiss").read_bytes(), b["index_version"])
    r = b["router"]
    router = Router.from_state(
        r["state"],
        dim=r["dim"],
        hidden=r["hidden"],
        expert_ids=r["expert_ids"],
        temperature=r["temperature"],
        version_id=r["version_id"],
    )
    m = b["matrix"]
    owners = np.repeat(np.asarray(m["expert_ids"], dtype=np.int64), np.diff(m["offsets"]))  # [N]
    t = time.perf_counter()
    matrix = ExpertMatrix(m["ids"], m["x"], owners, m["expert_ids"], device=device, dtype=torch.float32)
    matrix_ms = (time.perf_counter() - t) * 1000
    state = ServingState(0, 0, b["experts"], router, index, 0, b["lexical"], 0, matrix)
    generator = ExtractiveGenerator()
    pipeline = AskPipeline(
        embedder=None,
        state=lambda: state,
        store=Records(b["records"]),  # type: ignore[arg-type]
        generator=lambda name: generator,
        config=b["config"],
    )
    ask_all(pipeline, b["questions"][:2], b["vectors"])  # compile the kernels first
    got, ms = ask_all(pipeline, b["questions"], b["vectors"])
    want = b["expected"]
    same = [same_answer(w, g) for w, g in zip(want, got, strict=True)]
    reordered = sum(ok and w["ids"] != g["ids"] for w, g, ok in zip(want, got, same, strict=True))
    differ = [{"want": w, "got": g} for w, g, ok in zip(want, got, same, strict=True) if not ok]
    chosen, matrix._scoped = matrix._scoped, scoped_search_triton  # the Triton kernel whatever was measured
    forced, _ = ask_all(pipeline, b["questions"], b["vectors"])
    matrix._scoped = chosen
    forced_differ = [{"want": w, "got": g} for w, g in zip(want, forced, strict=True) if not same_answer(w, g)]
    result = {
        "command": "python benchmarks/gpu_pipeline.py " + " ".join(sys.argv[1:]),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke)",
        "backend": backend.current(),
        "scoped_kernel": matrix.kernel,
        "matrix_build_ms": round(matrix_ms, 1),
        "chunks": len(b["records"]),
        "questions": len(b["questions"]),
        "answers": len(want),
        "answers_by_path": {p: sum(g["path"] == p for g in got) for p in ("expert", "fallback")},
        "equal_to_the_cpu_service": len(want) - len(differ),
        "of_them_tied_ids_in_another_order": reordered,
        "differ": differ[:10],
        "triton_scoped_kernel_forced": {
            "equal_to_the_cpu_service": len(want) - len(forced_differ),
            "differ": forced_differ[:10],
        },
        "ms_a_question_as_served": {
            "p50": round(float(np.median(ms)), 2),
            "p99": round(float(np.percentile(ms, 99)), 2),
        },
    }
    write_result(out, result)
    print(json.dumps({k: v for k, v in result.items() if "differ" not in k}))
    if differ or forced_differ:
        raise SystemExit(
            f"{len(differ)} (kernel as chosen) and {len(forced_differ)} (Triton forced) of {len(want)} "
            "answers differ from the CPU service's"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="here: the store, the questions and the CPU service's answers")
    p.add_argument("--data-dir", type=Path, default=Path("/var/tmp/moerag-gpu-sample"))
    p.add_argument("--questions", type=int, default=48)
    c = sub.add_parser("check", help="on the GPU: the same questions with the kernels on")
    c.add_argument("--json", type=Path, required=True)
    c.add_argument("--smoke", action="store_true", help="on the CPU under TRITON_INTERPRET=1: the script runs")
    args = ap.parse_args()
    if args.command == "prepare":
        prepare(args.data_dir, args.questions)
    else:
        check(args.json, "cpu" if args.smoke else "cuda")


if __name__ == "__main__":
    main()
