"""/ask latency while the catalogue moves: does any question pay for building the next state?

    cp -r HELD_DIR/held-known /var/tmp/churn
    python benchmarks/state_churn.py --data-dir /var/tmp/churn

A real `moerag serve` on a copy of a store; askers (the FAQ dev questions, cycled, one request in
flight each) run throughout. Quiet and churn phases alternate (`--rounds` of each, `--phase-s`
seconds each, so both see the same warm server and the same noise). In a churn phase an uploader
adds a small document every `--every-s` seconds, each a new catalogue version (a new serving
state, a BM25 rebuild when its spacing allows). The report pools each condition's /ask latencies
(p50, p95, p99), caches off, and gives the p99 ratio churn / quiet; the catalogue versions the
server moved through say how many states were built, and /readyz what the largest build took.
Results: benchmarks/results/state-churn.json (`--name` for a variant, `--env` for its settings).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import percentile, write_result
from benchmarks.evalcorpus import load_questions
from benchmarks.load import NO_CACHE
from tests.server import Server

RESULTS = Path(__file__).resolve().parent / "results"


def churn(url: str, token: str, questions: list[str], args: argparse.Namespace) -> dict[str, Any]:
    lock = threading.Lock()
    latencies: dict[str, list[float]] = {"quiet": [], "churn": []}
    errors = {"quiet": 0, "churn": 0}
    phase = {"name": "warm-up"}
    done = threading.Event()
    feed = itertools.cycle(questions)
    uploads = {"sent": 0, "failed": 0}

    def asker() -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            while not done.is_set():
                with lock:
                    q, name = next(feed), phase["name"]
                t = time.perf_counter()
                r = c.post("/ask", json={"question": q})
                ms = (time.perf_counter() - t) * 1000
                with lock:
                    if name == phase["name"] and name in latencies:  # a request that crossed phases is dropped
                        if r.status_code == 200:
                            latencies[name].append(ms)
                        else:
                            errors[name] += 1

    def upload(c: httpx.Client, n: int) -> None:
        text = f"Churn note {n}. " + " ".join(questions[(n + i) % len(questions)] for i in range(5))
        r = c.post("/documents", json={"text": text, "title": f"churn {n}"})
        uploads["sent"] += 1
        uploads["failed"] += r.status_code >= 400

    def catalogue_version(c: httpx.Client) -> int:
        return int(c.get("/readyz").json()["catalogue_version"])

    threads = [threading.Thread(target=asker) for _ in range(args.askers)]
    for t in threads:
        t.start()
    with httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {token}"}) as c:
        time.sleep(args.warm_up_s)  # the caches and the question model warm
        v0 = catalogue_version(c)
        n = 0
        for _ in range(args.rounds):
            for name in ("quiet", "churn"):
                with lock:
                    phase["name"] = name
                end = time.monotonic() + args.phase_s
                while time.monotonic() < end:
                    if name == "churn":
                        upload(c, n)
                        n += 1
                    time.sleep(args.every_s)
        v1 = catalogue_version(c)
        serving = c.get("/readyz").json()["serving"]
    done.set()
    for t in threads:
        t.join()
    out: dict[str, Any] = {}
    for name, values in latencies.items():
        values.sort()
        out[name] = {
            "requests": len(values),
            "errors": errors[name],
            "p50_ms": percentile(values, 50),
            "p95_ms": percentile(values, 95),
            "p99_ms": percentile(values, 99),
        }
    out["p99_ratio_churn_over_quiet"] = round(out["churn"]["p99_ms"] / out["quiet"]["p99_ms"], 2)
    out["uploads"] = uploads
    out["catalogue_versions_moved"] = v1 - v0
    out["state_build_ms"] = serving.get("build_ms")  # last and largest, in the server (off the questions' path)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True, help="a store to serve (a copy: this writes to it)")
    ap.add_argument("--askers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--phase-s", type=float, default=30)
    ap.add_argument("--every-s", type=float, default=0.5)
    ap.add_argument("--warm-up-s", type=float, default=15)
    ap.add_argument("--env", nargs="*", default=[], metavar="KEY=VALUE", help="server settings of a variant")
    ap.add_argument("--name", default="state-churn")
    args = ap.parse_args()
    token = "churn-token"
    # No caches: a cached answer would hide the work, and a new state empties the answer cache.
    env = NO_CACHE | dict(kv.split("=", 1) for kv in args.env)
    server = Server(args.data_dir, token, args.data_dir.parent / "churn-server.log", **env)
    try:
        server.start(600)
        result = churn(server.url, token, [q["question"] for q in load_questions(None)], args)
    finally:
        server.stop()
    result["settings"] = {k: v for k, v in vars(args).items() if k != "data_dir"}
    result["command"] = " ".join(["python", *sys.argv])
    RESULTS.mkdir(exist_ok=True)
    write_result(RESULTS / f"{args.name}.json", result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
