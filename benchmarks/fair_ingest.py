"""Bounded, fair ingestion on a real `moerag serve`: what a large or junk document costs others.

    python benchmarks/fair_ingest.py --name fair-ingest

1. Refusals before work: 5 MB of `a a a …` (degenerate) and a 50 MB text of varied words (over
   MOERAG_MAX_DOCUMENT_CHARS): status, seconds to the answer, the server's peak RSS after each.
2. A large valid document (`--words`, ~1,000 chunks by default) uploaded while a 1 kB upload is
   made every few seconds (seconds to acknowledge, seconds until /search finds it) and /search
   runs in a loop (p50, p99), against /search alone beforehand. Peak RSS after.

`--tree DIR` serves another checkout of moerag (a baseline), with this machine's interpreter.
Results: benchmarks/results/<name>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import write_result
from tests.server import Server

RESULTS = Path(__file__).resolve().parent / "results"


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def varied_text(words: int, seed: int = 0, stems: tuple[str, ...] = ("data", "page", "log", "key")) -> str:
    rng = random.Random(seed)
    vocab = [f"{a}{b}" for a in stems for b in range(1000)]
    paragraphs = [" ".join(rng.choices(vocab, k=120)) + "." for _ in range(max(1, words // 120))]
    return "\n\n".join(f"Paragraph {i}. {p}" for i, p in enumerate(paragraphs))


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def summary(seconds: list[float]) -> dict[str, float]:
    return {"n": len(seconds), "p50": round(pct(seconds, 0.5) * 1000, 1), "p99": round(pct(seconds, 0.99) * 1000, 1)}


def search_loop(url: str, stop: threading.Event, out: list[float]) -> None:
    with httpx.Client(base_url=url, timeout=120) as c:
        while not stop.is_set():
            t = time.monotonic()
            c.post("/search", json={"query": "page log lock", "k": 5})
            out.append(time.monotonic() - t)
            time.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default="fair-ingest")
    ap.add_argument("--words", type=int, default=60_000)
    ap.add_argument("--tree", type=Path, default=None, help="serve this checkout instead (a baseline)")
    ap.add_argument("--skip-refusals", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fair-ingest-"))
    env = {"PYTHONPATH": str(args.tree)} if args.tree else {}
    server = Server(work / "data", "tok", work / "server.log", **env)
    if args.tree:  # `python -m app.cli` from the other tree: its own packages come first
        os.chdir(args.tree)
    client = server.start(300)
    assert server.proc is not None
    pid = server.proc.pid
    out: dict[str, Any] = {"tree": str(args.tree or "."), "peak_rss_mb_started": round(peak_rss_mb(pid), 1)}
    client.timeout = httpx.Timeout(900)
    try:
        if not args.skip_refusals:
            for name, data in (("degenerate_5mb", b"a " * 2_500_000), ("valid_50mb", varied_text(6_400_000).encode())):
                t = time.monotonic()
                r = client.post("/documents", files={"file": (f"{name}.txt", data, "text/plain")})
                out[name] = {
                    "bytes": len(data),
                    "status": r.status_code,
                    "code": r.json().get("error", {}).get("code") if r.status_code >= 400 else None,
                    "seconds": round(time.monotonic() - t, 2),
                    "peak_rss_mb": round(peak_rss_mb(pid), 1),
                }
                print(name, out[name], flush=True)
        alone: list[float] = []
        stop = threading.Event()
        th = threading.Thread(target=search_loop, args=(server.url, stop, alone))
        th.start()
        time.sleep(10)
        stop.set()
        th.join()
        large = varied_text(args.words, seed=1)
        result: dict[str, Any] = {}

        def upload_large() -> None:
            t = time.monotonic()
            r = client.post("/documents", json={"text": large, "title": "large"})
            result.update(status=r.status_code, seconds=round(time.monotonic() - t, 1), chunks=r.json().get("chunks"))

        during: list[float] = []
        stop = threading.Event()
        big = threading.Thread(target=upload_large)
        searches = threading.Thread(target=search_loop, args=(server.url, stop, during))
        big.start()
        searches.start()
        small: list[dict[str, float]] = []
        with httpx.Client(base_url=server.url, headers={"Authorization": "Bearer tok"}, timeout=300) as c:
            n = 0
            while big.is_alive():
                time.sleep(3)
                n += 1
                # Words of its own (not the large document's), found by its own first sentence in the
                # top 50 (word salads of one vocabulary embed alike: a dozen of them crowd a top 10).
                text = varied_text(150, seed=100 + n, stems=("zebra", "quokka", "otter", "heron"))
                query = " ".join(text.split()[2:22])
                t = time.monotonic()
                r = c.post("/documents", json={"text": text, "title": f"small {n}"})
                acked = time.monotonic() - t
                doc_id = r.json().get("id")
                found = None
                while found is None and time.monotonic() - t < 120:
                    hits = c.post("/search", json={"query": query, "k": 50}).json().get("hits", [])
                    if any(h["document_id"] == doc_id for h in hits):
                        found = time.monotonic() - t
                seen = round(found, 2) if found is not None else None
                small.append({"status": r.status_code, "acked_s": round(acked, 2), "searchable_s": seen})
        big.join()
        stop.set()
        searches.join()
        out["large"] = {**result, "words": args.words, "characters": len(large)}
        out["small_uploads_during"] = small
        out["search_alone_ms"] = {
            "n": len(alone),
            "p50": round(pct(alone, 0.5) * 1000, 1),
            "p99": round(pct(alone, 0.99) * 1000, 1),
        }
        out["search_during_ms"] = {
            "n": len(during),
            "p50": round(pct(during, 0.5) * 1000, 1),
            "p99": round(pct(during, 0.99) * 1000, 1),
        }
        out["peak_rss_mb_end"] = round(peak_rss_mb(pid), 1)
        stats = client.get("/stats").json()
        out["stats_end"] = {k: stats.get(k) for k in ("documents", "chunks", "index_vectors")}
    finally:
        server.stop()
    print(json.dumps(out, indent=1))
    RESULTS.mkdir(exist_ok=True)
    write_result(RESULTS / f"{args.name}.json", out)


if __name__ == "__main__":
    main()
