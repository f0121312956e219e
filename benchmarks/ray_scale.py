"""Expert shards on Ray Serve, on one machine: what a hop to a shard costs, how a shard's
throughput grows with its replicas, and what one confident question touches against a full replica.

    cp -r HELD_DIR/held-known RAY_DIR
    python benchmarks/ray_scale.py --data-dir RAY_DIR

One run, one process driving a local Ray cluster (`--cpus`, 2 by default: every machine kind
here has two cores, so throughput saturates early and the figures say so):

1. **Work per question.** The store's experts are spread over `--shards` shards, largest first
   onto the lightest shard. The FAQ dev questions are asked through the ask flow (`prepare`,
   mode auto) over the shards carved in this process; every shard search is recorded: which
   shard, which lists, how many vectors those lists hold. A confident question touches one
   shard; the fallback every shard that holds one of its nearest lists.
2. **Hop cost.** The recorded searches are replayed against the Serve deployments (one replica
   a shard): a bare call (`stats`, no search), the same call awaited on an event loop, a plain
   Ray actor's call (the floor under any Serve hop), the search through the handle, and the
   same search on the carved part in this process; p50 / p99 of each.
3. **Throughput.** The recorded questions (each its shard searches at once) are replayed by
   `--clients` closed-loop threads for `--seconds`, with 1, 2, 3 replicas a shard, and in this
   process on the carved parts for comparison.

Results: benchmarks/results/ray-scale.json (`--name` for a variant).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.core.settings import Settings
from app.runtime import Runtime
from app.shards.client import searches
from app.shards.map import ShardMap, parse
from app.shards.replicas import deploy
from benchmarks.common import write_result
from benchmarks.evalcorpus import load_questions
from engine.pipeline import AskRequest
from index import ClusteredIndex
from index.shards import ShardedIndex, carve, local_search

RESULTS = Path(__file__).resolve().parent / "results"
Call = tuple[int, np.ndarray, int, np.ndarray]  # (shard, question [1, D], k, lists)


def spread(sizes: dict[str, int], shards: int, replicas: int) -> ShardMap:
    """Experts by vectors, largest first, each onto the shard holding the fewest so far; the
    lightest shard also holds the lists no expert owns."""
    load = [0] * shards
    names: list[list[str]] = [[] for _ in range(shards)]
    for name, size in sorted(sizes.items(), key=lambda kv: -kv[1]):
        s = min(range(shards), key=load.__getitem__)
        load[s] += size
        names[s].append(name)
    lightest = min(range(shards), key=load.__getitem__)
    return parse(
        {
            "shards": [
                {"name": f"s{i}", "experts": names[i], "replicas": replicas, "default": i == lightest}
                for i in range(shards)
            ]
        }
    )


def record(rt: Runtime, shard_map: ShardMap, questions: Sequence[str]) -> dict[str, Any]:
    """Ask every question over shards carved here; each question's path and shard searches."""
    state = rt.state()
    index: ClusteredIndex = state.index  # type: ignore[assignment]
    lists = shard_map.lists_of_shards(state.experts, index.nlist)
    sizes = index.list_sizes()
    parts = [carve(index, lists[s]) for s in range(len(lists))]
    calls: list[Call] = []

    def recording(s: int) -> Callable[..., Any]:
        search = local_search(parts[s])

        def scan(q: np.ndarray, k: int, wanted: np.ndarray, at_least: int | None = None) -> Any:
            calls.append((s, np.array(q), k, np.array(wanted)))
            return search(q, k, wanted, at_least)

        return scan

    over = dataclasses.replace(state, index=ShardedIndex(index, lists, [recording(s) for s in range(len(lists))]))
    rt.pipeline.state = lambda: over
    asked = []
    for question in questions:
        calls.clear()
        route = rt.pipeline.prepare(AskRequest(question)).route
        scope = np.array(sorted(route.expert.clusters), dtype=np.int64) if route.expert is not None else None
        main: list[Call] = []
        probes: list[Call] = []  # a routed question: its expert's search, and the route's check probing elsewhere
        for call in calls:
            inside = scope is not None and bool(np.isin(call[3], scope).all())
            (main if inside or scope is None else probes).append(call)

        def scanned(part: list[Call]) -> int:
            return int(sum(sizes[w].sum() for _, _, _, w in part))

        asked.append(
            {
                "path": route.path,
                "shards": sorted({s for s, *_ in calls}),
                "search_shards": sorted({s for s, *_ in main}),
                "scanned": scanned(main),
                "probes": len(probes),
                "probe_scanned": scanned(probes),
                "calls": list(calls),
            }
        )
    return {"parts": parts, "lists": lists, "asked": asked, "ntotal": index.ntotal}


def mean(values: Sequence[float]) -> float | None:
    return round(float(np.mean(values)), 1) if len(values) else None


def timed(fn: Callable[[], Any], n: int) -> dict[str, float]:
    ms = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t) * 1000)
    return summary(ms)


def summary(ms: list[float]) -> dict[str, float]:
    ms, n = sorted(ms), len(ms)
    return {"p50_ms": round(ms[n // 2], 3), "p99_ms": round(ms[math.ceil(0.99 * n) - 1], 3), "n": n}


def floors(handles: Sequence[Any], n: int) -> dict[str, Any]:
    """How low a hop goes on this machine: the same no-work call awaited on an event loop (Serve's
    handle without the hand-off from a caller's thread to its loop), and a plain Ray actor's call
    (Ray core, no Serve router: the floor under any Serve hop)."""
    import asyncio

    import ray

    @ray.remote(num_cpus=0)
    class Echo:
        def ping(self) -> int:
            return 0

    echo = Echo.remote()  # type: ignore[attr-defined]
    ray.get(echo.ping.remote())

    async def awaited() -> list[float]:
        ms = []
        for i in range(n):
            t = time.perf_counter()
            await handles[i % len(handles)].stats.remote()
            ms.append((time.perf_counter() - t) * 1000)
        return ms

    out = {"serve_call_awaited_on_a_loop": summary(asyncio.run(awaited()))}
    out["ray_actor_call"] = timed(lambda: ray.get(echo.ping.remote()), n)
    ray.kill(echo)
    return out


def hops(handles: Sequence[Any], parts: Sequence[ClusteredIndex], calls: Sequence[Call]) -> dict[str, Any]:
    cycle = itertools.cycle(calls)
    n = max(300, len(calls))

    def bare() -> None:
        s, *_ = next(cycle)
        handles[s].stats.remote().result()

    def through_handle() -> None:
        s, q, k, lists = next(cycle)
        handles[s].search.remote(q, k, lists, 0, None).result()

    def in_process() -> None:
        s, q, k, lists = next(cycle)
        parts[s].search(q, k, lists)

    for _ in range(50):  # warm: every replica answered once, the handles' routers built
        through_handle()
    return {
        "bare_call": timed(bare, n),
        **floors(handles, n),
        "search_through_handle": timed(through_handle, n),
        "search_in_process": timed(in_process, n),
    }


def throughput(
    ask: Callable[[list[Call]], None], questions: Sequence[list[Call]], clients: int, seconds: float
) -> float:
    """Questions per second: `clients` threads, each one question (its shard searches) at a time."""
    feed, lock, done = itertools.cycle(questions), threading.Lock(), threading.Event()
    answered = [0]

    def client() -> None:
        while not done.is_set():
            with lock:
                calls = next(feed)
            ask(calls)
            with lock:
                answered[0] += 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    time.sleep(seconds)  # the measured window: a fixed length is the point here
    done.set()
    for t in threads:
        t.join(60)
    return round(answered[0] / seconds, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True, help="a store (SQLite), e.g. a copy of the held-known one")
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--name", default="ray-scale")
    args = ap.parse_args()
    import ray
    from ray import serve

    rt = Runtime(Settings(data_dir=args.data_dir))
    rt.start(run_jobs=False)
    try:
        state = rt.state()
        sizes_of = rt.state().index.list_sizes()
        expert_vectors = {p.name: int(sizes_of[list(p.clusters)].sum()) for p in state.experts.values()}
        shard_map = spread(expert_vectors, args.shards, 1)
        questions = [q["question"] for q in load_questions()]
        seen = record(rt, shard_map, questions)
        asked = seen["asked"]
        routed = [a for a in asked if a["path"] == "expert"]
        fallback = [a for a in asked if a["path"] != "expert"]
        held = [int(p.ntotal) for p in seen["parts"]]
        work = {
            "vectors_full_replica": seen["ntotal"],
            "vectors_per_shard": dict(zip([s.name for s in shard_map.shards], held, strict=True)),
            "experts_per_shard": {s.name: list(s.experts) for s in shard_map.shards},
            "questions": len(asked),
            "routed": len(routed),
            "routed_search_shards_mean": mean([len(a["search_shards"]) for a in routed]),
            "routed_search_vectors_scanned_mean": mean([a["scanned"] for a in routed]),
            "routed_check_probes_mean": mean([a["probes"] for a in routed]),
            "routed_check_vectors_scanned_mean": mean([a["probe_scanned"] for a in routed]),
            "routed_shards_touched_mean": mean([len(a["shards"]) for a in routed]),
            "routed_vectors_held_by_its_shard_mean": mean(
                [held[a["search_shards"][0]] for a in routed if a["search_shards"]]
            ),
            "fallback_shards_touched_mean": mean([len(a["shards"]) for a in fallback]),
            "fallback_vectors_scanned_mean": mean([a["scanned"] for a in fallback]),
        }
        print(json.dumps(work, indent=2), flush=True)
        calls = [c for a in asked for c in a["calls"]]
        per_question = [a["calls"] for a in asked if a["calls"]]

        ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
        try:
            t = time.perf_counter()
            handles = deploy(shard_map, rt.settings.db_url, rt.embedder.dim)
            deploy_s = round(time.perf_counter() - t, 1)
            hop = hops(handles, seen["parts"], calls)
            print(json.dumps(hop, indent=2), flush=True)

            def over_ray(found: list[Any]) -> Callable[[list[Call]], None]:
                def ask(qcalls: list[Call]) -> None:
                    pending = [found[s](q, k, lists) for s, q, k, lists in qcalls]
                    for p in pending:
                        p.result()

                return ask

            parts = seen["parts"]

            def in_process(qcalls: list[Call]) -> None:
                for s, q, k, lists in qcalls:
                    parts[s].search(q, k, lists)

            rates = {"in_process": throughput(in_process, per_question, args.clients, args.seconds)}
            running = shard_map
            for replicas in (1, 2, 3):
                scaled = spread(expert_vectors, args.shards, replicas)
                if scaled.app_name != running.app_name:  # each map version is its own application
                    serve.delete(running.app_name)
                running, handles = scaled, deploy(scaled, rt.settings.db_url, rt.embedder.dim)
                rates[f"ray_{replicas}_replicas_a_shard"] = throughput(
                    over_ray(searches(handles)), per_question, args.clients, args.seconds
                )
                print(replicas, rates, flush=True)
        finally:
            serve.shutdown()
            ray.shutdown()
    finally:
        rt.close()
    result = {
        "work_per_question": work,
        "hop": hop,
        "questions_per_second": rates,
        "deploy_seconds": deploy_s,
        "settings": {
            **{k: str(v) for k, v in vars(args).items()},
            "cpu_count": os.cpu_count(),
            "shard_map": shard_map.version,
        },
        "command": "python benchmarks/ray_scale.py --data-dir D"
        + (f" --name {args.name}" if args.name != "ray-scale" else ""),
    }
    RESULTS.mkdir(exist_ok=True)
    write_result(RESULTS / f"{args.name}.json", result)
    print(json.dumps(result["questions_per_second"], indent=2))


if __name__ == "__main__":
    main()
