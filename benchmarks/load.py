"""/ask under concurrent load: a real `moerag serve` on 127.0.0.1 and a bounded load generator.

    python benchmarks/load.py --data-dir /tmp/evaldata --concurrency 1 2 4 --requests 200 --seconds 60

Each level sends at most `--requests` questions (the FAQ dev questions, cycled) or stops after
`--seconds`, whichever comes first, with `c` clients each keeping one request in flight.
Extractive generator (the default), so the figures are moerag's own cost, not an LLM's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.evalcorpus import load_questions
from benchmarks.routing import percentile
from tests.server import Server  # the same `moerag serve` launcher the crash-recovery tests use


def load_level(url: str, questions: list[str], concurrency: int, requests: int, seconds: float) -> dict[str, Any]:
    """`concurrency` clients, each one request in flight, until `requests` are sent or `seconds` pass."""
    feed = itertools.islice(itertools.cycle(questions), requests)
    lock = threading.Lock()
    latencies: list[float] = []
    route_ms: list[float] = []
    paths: Counter[str] = Counter()
    errors: Counter[int] = Counter()
    deadline = time.monotonic() + seconds

    def client() -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            while time.monotonic() < deadline:
                with lock:
                    q = next(feed, None)
                if q is None:
                    return
                t = time.perf_counter()
                r = http.post("/ask", json={"question": q})
                ms = (time.perf_counter() - t) * 1000
                with lock:
                    if r.status_code != 200:
                        errors[r.status_code] += 1
                        continue
                    body = r.json()
                    latencies.append(ms)
                    route_ms.append(body["timings_ms"].get("embed", 0.0) + body["timings_ms"].get("route", 0.0))
                    paths[body["route"]["path"]] += 1

    # Warm-up outside the measurement: the first request pays lazy imports.
    httpx.post(f"{url}/ask", json={"question": questions[0]}, timeout=60)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - t0
    latencies.sort()
    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "errors": dict(errors),
        "seconds": round(elapsed, 1),
        "throughput_rps": round(len(latencies) / elapsed, 2),
        "p50_ms": percentile(latencies, 50),
        "p95_ms": percentile(latencies, 95),
        "p99_ms": percentile(latencies, 99),
        "embed_plus_route_ms_mean": round(statistics.mean(route_ms), 2) if route_ms else None,
        "paths": dict(paths),
    }


def run(
    data_dir: Path,
    levels: list[int],
    requests: int,
    seconds: float,
    log: Path,
    questions: list[str] | None = None,
    threads: Sequence[int] = (0,),
) -> dict[str, Any]:
    """One server process per entry of `threads` (> 0 caps its torch/OpenMP threads; 0: torch's default)."""
    qs = questions or [q["question"] for q in load_questions()]
    rows = []
    for n in threads:
        server = Server(data_dir, "bench-load", log, **({"OMP_NUM_THREADS": str(n)} if n > 0 else {}))
        server.start(timeout=600).close()
        try:
            for c in levels:
                print(f"load: {c} concurrent client(s), server threads {n or 'default'} ...", flush=True)
                rows.append(load_level(server.url, qs, c, requests, seconds) | {"server_threads": n or os.cpu_count()})
                print(json.dumps(rows[-1]), flush=True)
        finally:
            server.stop()
    return {"levels": rows, "server_processes": 1, "cpus": os.cpu_count()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--threads", type=int, nargs="+", default=[0], help="server torch threads per run (0: default)")
    ap.add_argument("--log", type=Path, default=Path("load-server.log"))
    args = ap.parse_args()
    result = run(args.data_dir, args.concurrency, args.requests, args.seconds, args.log, threads=args.threads)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
