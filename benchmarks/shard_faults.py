"""Expert shards on Ray Serve under a frozen replica, and what a shard replica costs: one run on a
local Ray cluster over the sample store (`moerag serve --sample` builds it).

    python benchmarks/shard_faults.py --data-dir SAMPLE_DIR     # results: benchmarks/results/shard-faults.json

1. **One process.** The store is served in this process (no shards): `--questions` questions
   (the first words of chunks spread over the store, in a fixed order) asked by `--clients` closed-loop threads
   for `--seconds`: questions/s and p50; its route reads its whole index, as one process does by default.
2. **Over shards.** The store's experts spread over `--shards` shards (largest first onto the
   lightest; one replica each), the same runtime's serving state republished over them, reached
   as a server reaches them (through its link, a child process joined to Ray): the
   same load, the route read from the central sample (as over shards by default); and, question by
   question, the shards each one called (the breakers' counts), by path (confident or fallback).
3. **A frozen replica.** The only replica of the shard holding the most vectors is stopped
   (SIGSTOP) and the load runs again: questions/s against healthy, the first answer's time and
   the slowest after it (a question has one deadline, `--timeout`, for all its shard calls; a
   shard that failed is skipped by its breaker until a probe finds it back). Then SIGCONT.
4. **Memory.** Each replica's RSS (its process, read from /proc), and the tier's whole.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import write_result

RESULTS = Path(__file__).resolve().parent / "results"


def rss_mib(pid: int) -> float:
    """A process's resident memory (MiB), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def load(rt: Any, questions: list[str], clients: int, seconds: float) -> dict[str, Any]:
    """`clients` threads asking `questions` in turn through the ask flow for `seconds`."""
    from engine.pipeline import AskRequest

    took: list[float] = []
    partial = 0
    stop = time.monotonic() + seconds
    lock = threading.Lock()

    def ask(offset: int) -> None:
        nonlocal partial
        n = offset
        while time.monotonic() < stop:
            t = time.perf_counter()
            route = rt.pipeline.prepare(AskRequest(questions[n % len(questions)])).route
            with lock:
                took.append(time.perf_counter() - t)
                partial += bool(route.missing_shards)
            n += clients

    threads = [threading.Thread(target=ask, args=(c,)) for c in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return {
        "questions": len(took),
        "per_s": round(len(took) / seconds, 2),
        "p50_ms": round(statistics.median(took) * 1000, 2) if took else None,
        "max_ms": round(max(took) * 1000, 1),
        "first_ms": round(took[0] * 1000, 1) if took else None,
        "partial": partial,
        "latencies_ms": [round(t * 1000, 1) for t in took],
    }


def questions_of(rt: Any, n: int) -> list[str]:
    """`n` questions from the store itself: the first ten words of chunks spread evenly over it."""
    from sqlalchemy import select

    from app.core.models import Chunk

    with rt.sessions() as s:
        texts = s.scalars(select(Chunk.text).order_by(Chunk.id)).all()
    step = max(1, len(texts) // n)
    return [" ".join(t.split()[:10]) for t in texts[::step][:n]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True, help="a sample store (moerag serve --sample)")
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--questions", type=int, default=64)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--timeout", type=float, default=2.0, help="a question's deadline for its shard calls")
    ap.add_argument("--cpus", type=int, default=2, help="the local Ray cluster's CPUs")
    ap.add_argument("--name", default="shard-faults")
    args = ap.parse_args()

    import ray

    from app.core.settings import Settings
    from app.runtime import Runtime
    from app.shards.client import RayShards
    from app.shards.link import ShardLink
    from app.shards.replicas import deploy
    from benchmarks.ray_scale import spread
    from engine.central_sample import SHARDED_SHARE
    from engine.pipeline import AskRequest

    # The central sample is built (a server over shards has one by default) but read only over the
    # shards: the one process answers as one process does by default, from its whole index.
    settings = Settings(
        data_dir=args.data_dir, question_cache=0, answer_cache=0, trace_questions=False, routing_sample=SHARDED_SHARE
    )
    rt = Runtime(settings)
    rt.start(run_jobs=False)
    link: ShardLink | None = None
    result: dict[str, Any] = {
        "command": "python benchmarks/shard_faults.py --data-dir SAMPLE_DIR"
        + "".join(f" --{k} {getattr(args, k)}" for k in ("shards", "clients", "seconds", "timeout")),
        "cpus": args.cpus,
    }
    try:
        questions = questions_of(rt, args.questions)
        state = rt.state()
        sizes = {e.name: int(state.index.scan_size(list(e.clusters))[1]) for e in state.experts.values()}
        shard_map = spread(sizes, args.shards, replicas=1)
        result["shard_map"] = [{"shard": s.name, "experts": list(s.experts)} for s in shard_map.shards]
        rt.pipeline.config.routing_sample = False
        result["one_process"] = load(rt, questions, args.clients, args.seconds)
        rt.pipeline.config.routing_sample = True
        print("one process", {k: v for k, v in result["one_process"].items() if k != "latencies_ms"}, flush=True)

        ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
        handles = deploy(shard_map, settings.db_url, rt.embedder.dim)
        states = rt.services.states
        # As a server reaches them: through its link, a child process joined to the cluster (app.shards.link).
        link = ShardLink(ray.get_runtime_context().gcs_address)
        link.start()
        tier = RayShards(shard_map, timeout_seconds=args.timeout, link=link)
        states.shards = tier
        states.changed(rt.catalogue.version, frozenset({"index"}))

        touched: Counter[tuple[str, int]] = Counter()  # (path, shards called) -> questions
        for q in questions:
            before = list(tier.breakers.calls)
            route = rt.pipeline.prepare(AskRequest(q)).route
            called = sum(1 for a, b in zip(before, tier.breakers.calls, strict=True) if b > a)
            touched[(route.path, called)] += 1
        confident = {n: c for (path, n), c in touched.items() if path == "expert"}
        result["shards_called"] = {
            "confident": {str(n): c for n, c in sorted(confident.items())},
            "fallback": {str(n): c for (path, n), c in sorted(touched.items()) if path == "fallback"},
            "confident_one_shard_share": round(confident.get(1, 0) / max(1, sum(confident.values())), 3),
        }
        print("shards called", result["shards_called"], flush=True)

        result["healthy"] = load(rt, questions, args.clients, args.seconds)
        print("healthy", {k: v for k, v in result["healthy"].items() if k != "latencies_ms"}, flush=True)
        stats = [h.stats.remote().result() for h in handles]
        result["replica_rss_mib"] = {s.name: rss_mib(st["pid"]) for s, st in zip(shard_map.shards, stats, strict=True)}
        victim = max(range(len(stats)), key=lambda n: stats[n]["vectors"])
        pid = stats[victim]["pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            frozen = load(rt, questions, args.clients, args.seconds)
        finally:
            os.kill(pid, signal.SIGCONT)
        result["frozen"] = frozen | {
            "shard": shard_map.shards[victim].name,
            "max_past_deadline_ms": round(frozen["max_ms"] - args.timeout * 1000, 1),
            "per_s_over_healthy": round(frozen["per_s"] / result["healthy"]["per_s"], 3),
            "health": tier.health(),
        }
        print("frozen", {k: v for k, v in result["frozen"].items() if k != "latencies_ms"}, flush=True)
        result["over_shards_p50_over_one_process"] = round(
            result["healthy"]["p50_ms"] / result["one_process"]["p50_ms"], 2
        )
        for part in ("one_process", "healthy", "frozen"):
            lat = result[part].pop("latencies_ms")
            result[part]["p95_ms"] = round(statistics.quantiles(lat, n=20)[18], 1) if len(lat) > 20 else None
    finally:
        rt.close()
        if link is not None:
            link.close()
        if ray.is_initialized():
            ray.shutdown()
    RESULTS.mkdir(exist_ok=True)
    write_result(RESULTS / f"{args.name}.json", result)


if __name__ == "__main__":
    main()
