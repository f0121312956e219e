"""Soak: a real `moerag serve` under mixed load at saturation for minutes; is anything drifting?

    cp -r DATA_DIR /var/tmp/soakdata
    python benchmarks/soak.py --data-dir /var/tmp/soakdata --minutes 10

Askers (the FAQ dev questions, cycled, one request in flight each), one uploader (a small new
document every half second) and one reader (lists and searches) run together. Every 10 s
window records requests, errors, /ask p50/p95 and the server's RSS. The report gives the RSS
slope over the second half (after warm-up) and plots the three series. Not in CI.
Results: benchmarks/results/soak.{json,png}.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import percentile, write_result
from benchmarks.evalcorpus import load_questions
from tests.server import Server

RESULTS = Path(__file__).resolve().parent / "results"
WINDOW_S = 10.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def soak(url: str, token: str, pid: int, questions: list[str], minutes: float, askers: int) -> dict[str, Any]:
    lock = threading.Lock()
    window: dict[str, Any] = {"ask_ms": [], "requests": 0, "errors": Counter()}
    windows: list[dict[str, Any]] = []
    end = time.monotonic() + minutes * 60
    feed = itertools.cycle(questions)

    def record(status: int, ask_ms: float | None = None) -> None:
        with lock:
            window["requests"] += 1
            if status >= 400:
                window["errors"][status] += 1
            elif ask_ms is not None:
                window["ask_ms"].append(ask_ms)

    def asker() -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            while time.monotonic() < end:
                with lock:
                    q = next(feed)
                t = time.perf_counter()
                try:
                    r = c.post("/ask", json={"question": q})
                    record(r.status_code, (time.perf_counter() - t) * 1000)
                except httpx.TransportError:
                    record(599)

    def uploader() -> None:
        with httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {token}"}) as c:
            for n in itertools.count():
                if time.monotonic() >= end:
                    return
                text = f"Soak note {n}. " + " ".join(questions[n % len(questions)] for _ in range(5))
                try:
                    record(c.post("/documents", json={"text": text, "title": f"soak {n}"}).status_code)
                except httpx.TransportError:
                    record(599)
                time.sleep(0.5)

    def reader() -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            for n in itertools.count():
                if time.monotonic() >= end:
                    return
                try:
                    record(c.get("/documents", params={"offset": n % 500, "limit": 20}).status_code)
                    record(c.post("/search", json={"query": questions[n % len(questions)], "k": 10}).status_code)
                except httpx.TransportError:
                    record(599)

    threads = [threading.Thread(target=asker) for _ in range(askers)]
    threads += [threading.Thread(target=uploader), threading.Thread(target=reader)]
    start = time.monotonic()
    for t in threads:
        t.start()
    while time.monotonic() < end:
        time.sleep(WINDOW_S)
        with lock:
            ask_ms = sorted(window["ask_ms"])
            windows.append(
                {
                    "t_s": round(time.monotonic() - start, 1),
                    "requests": window["requests"],
                    "errors": dict(window["errors"]),
                    "ask_p50_ms": percentile(ask_ms, 50),
                    "ask_p95_ms": percentile(ask_ms, 95),
                    "rss_mb": round(rss_mb(pid), 1),
                }
            )
            window.update(ask_ms=[], requests=0, errors=Counter())
        print(json.dumps(windows[-1]), flush=True)
    for t in threads:
        t.join()
    half = windows[len(windows) // 2 :]
    slope = np.polyfit([w["t_s"] / 60 for w in half], [w["rss_mb"] for w in half], 1)[0] if len(half) > 1 else 0.0
    total_errors = sum(sum(w["errors"].values()) for w in windows)
    return {
        "minutes": minutes,
        "askers": askers,
        "requests": sum(w["requests"] for w in windows),
        "errors": total_errors,
        "rss_slope_mb_per_min_second_half": round(float(slope), 2),
        "rss_mb_first_last": [windows[0]["rss_mb"], windows[-1]["rss_mb"]] if windows else [],
        "windows": windows,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w = result["windows"]
    t = [x["t_s"] / 60 for x in w]
    fig, ax = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    ax[0].plot(t, [x["ask_p95_ms"] for x in w], label="p95")
    ax[0].plot(t, [x["ask_p50_ms"] for x in w], label="p50")
    ax[0].set_ylabel("/ask ms")
    ax[0].legend()
    ax[1].bar(t, [sum(x["errors"].values()) for x in w], width=0.1)
    ax[1].set_ylabel("errors / 10 s")
    ax[2].plot(t, [x["rss_mb"] for x in w])
    ax[2].set_ylabel("server RSS MB")
    ax[2].set_xlabel("minutes")
    fig.suptitle(
        f"soak: {result['requests']} requests, {result['errors']} errors, "
        f"RSS slope {result['rss_slope_mb_per_min_second_half']} MB/min (second half)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True, help="a store to serve (a copy: the soak writes to it)")
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--askers", type=int, default=6)
    args = ap.parse_args()
    token = "soak-token"
    server = Server(args.data_dir, token, args.data_dir.parent / "soak-server.log")
    try:
        server.start(600)
        assert server.proc is not None
        result = soak(
            server.url, token, server.proc.pid, [q["question"] for q in load_questions(None)], args.minutes, args.askers
        )
    finally:
        server.stop()
    result["command"] = " ".join(["python", *sys.argv])
    RESULTS.mkdir(exist_ok=True)
    write_result(RESULTS / "soak.json", result)
    plot(result, RESULTS / "soak.png")
    print(json.dumps({k: v for k, v in result.items() if k != "windows"}, indent=2))


if __name__ == "__main__":
    main()
