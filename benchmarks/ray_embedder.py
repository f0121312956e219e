"""The embedder as a Ray Serve deployment (app.shards.embedder) against the model in the server's
process, on one machine, in one run:

    python benchmarks/ray_embedder.py

The FAQ dev questions are embedded as a server embeds them (`QuestionEncoder`: dynamic batching
over the compiled question model), first by the model loaded in this process, then through one
embedder replica on a local Ray cluster (`--cpus`, 2: every machine kind here has two cores, the
replica and this process share them):

- one at a time: latency p50 / p99 a question;
- `--clients` closed-loop threads for `--seconds`: questions a second, and the sizes of the
  model calls the replica made (Serve's batching of questions from every caller);
- an upload's chunks: 256 passages embedded in one call, seconds.

Results: benchmarks/results/ray-embedder.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.evalcorpus import load_questions
from engine.embedder import Embedder
from engine.question_encoder import QuestionEncoder

RESULTS = Path(__file__).resolve().parent / "results"


def percentiles(ms: list[float]) -> dict[str, float]:
    return {"p50_ms": round(float(np.percentile(ms, 50)), 2), "p99_ms": round(float(np.percentile(ms, 99)), 2)}


def one_at_a_time(encode: Callable[[str], Any], questions: list[str]) -> dict[str, float]:
    ms = []
    for q in questions:
        t = time.perf_counter()
        encode(q)
        ms.append((time.perf_counter() - t) * 1000)
    return percentiles(ms)


def closed_loop(encode: Callable[[str], Any], questions: list[str], clients: int, seconds: float) -> float:
    """Questions a second, `clients` threads each asking the next question once its last is back."""
    done = [0] * clients
    stop = time.monotonic() + seconds

    def client(n: int) -> None:
        i = n
        while time.monotonic() < stop:
            encode(questions[i % len(questions)])
            done[n] += 1
            i += clients

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return round(sum(done) / (time.perf_counter() - t), 1)


def measure(embedder: Any, questions: list[str], passages: list[str], clients: int, seconds: float) -> dict[str, Any]:
    # No cache: every question goes through the model, as distinct questions do.
    encoder = QuestionEncoder(embedder.encode_questions, max_batch=16, cache_size=0, workers=2)
    encode = lambda q: encoder.submit(q).result()  # noqa: E731
    for q in questions[:16]:  # warm
        encode(q)
    out: dict[str, Any] = {"one_at_a_time": one_at_a_time(encode, questions)}
    out[f"questions_per_s_{clients}_clients"] = closed_loop(encode, questions, clients, seconds)
    t = time.perf_counter()
    embedder.encode(passages)
    out["256_passages_s"] = round(time.perf_counter() - t, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--name", default="ray-embedder")
    args = ap.parse_args()
    questions = [r["question"] for r in load_questions()]
    passages = [f"{q} The answer is in the manual, section {n}, with an example and its output." for n, q in
                enumerate(questions * 2)][:256]  # fmt: skip

    local = Embedder()
    question_model = local.compile_questions("auto")
    result: dict[str, Any] = {"questions": len(questions), "dtype": local.dtype_name, "question_model": question_model}
    result["in_process"] = measure(local, questions, passages, args.clients, args.seconds)
    vectors = local.encode_questions(questions)
    del local
    print(json.dumps(result, indent=2), flush=True)

    import ray
    from ray import serve

    from app.shards import embedder as ray_embedder

    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    try:
        t = time.perf_counter()
        handle = ray_embedder.deploy(1, 16, None, "auto", 32, "auto")
        remote = ray_embedder.RemoteEmbedder(handle)
        result["deploy_s"] = round(time.perf_counter() - t, 1)
        result["through_deployment"] = measure(remote, questions, passages, args.clients, args.seconds)
        batches = handle.recent_batches.remote().result()  # the last 100 model calls (the closed loop's)
        result["through_deployment"]["model_call_sizes_last_100"] = {
            "mean": round(float(np.mean(batches)), 2),
            "max": int(max(batches)),
        }
        result["max_difference_to_in_process"] = float(np.abs(remote.encode_questions(questions) - vectors).max())
        serve.shutdown()
    finally:
        ray.shutdown()
    result["command"] = "python benchmarks/ray_embedder.py" + (
        f" --name {args.name}" if args.name != "ray-embedder" else ""
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
