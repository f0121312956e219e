"""A/B of /ask throughput between two checkouts of moerag, alternating, in one run.

    git worktree add /var/tmp/before <commit>        # A: the code before a change
    python benchmarks/ab_load.py --a /var/tmp/before --data-a /var/tmp/ab/a \\
        --b . --data-b /var/tmp/ab/b --clients 8 --seconds 20 --rounds 2

Each round starts A's server, loads it, stops it, then B's, so both see the same machine noise
(rounds alternate A, B, A, B). Each checkout serves its own data dir (copies of one store:
a newer checkout migrates its copy forward, which the older one could not read). Question and
answer caches are off, as in benchmarks/load.py, whose load generator this reuses. Prints one
JSON line per measurement and a summary {"A": [req/s ...], "B": [...], "b_over_a": ratio of means}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.evalcorpus import load_questions
from benchmarks.load import NO_CACHE, load_level
from tests.server import Server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", type=Path, required=True, help="checkout A (its `app` package is served)")
    ap.add_argument("--data-a", type=Path, required=True)
    ap.add_argument("--b", type=Path, required=True, help="checkout B")
    ap.add_argument("--data-b", type=Path, required=True)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--questions", type=Path, help="default: ../shared/eval/faq-dev.jsonl")
    ap.add_argument("--log", type=Path, default=Path("ab-servers.log"))
    args = ap.parse_args()

    questions = [q["question"] for q in load_questions(args.questions)]
    log = args.log.resolve()
    # Resolved once, before the first chdir: a relative `--b .` would otherwise name A's checkout.
    targets = (("A", args.a.resolve(), args.data_a.resolve()), ("B", args.b.resolve(), args.data_b.resolve()))
    throughput: dict[str, list[float]] = {"A": [], "B": []}
    for r in range(args.rounds):
        for name, repo, data in targets:
            os.chdir(repo)  # `python -m app.cli` serves the checkout it starts in
            server = Server(data, "bench-ab", log, **NO_CACHE)
            server.start(timeout=900).close()
            try:
                row = asyncio.run(load_level(server.url, questions, args.clients, args.seconds))
            finally:
                server.stop()
            throughput[name].append(row["throughput_rps"])
            print(json.dumps({"target": name, "round": r, **row}), flush=True)
    ratio = statistics.mean(throughput["B"]) / statistics.mean(throughput["A"])
    print(json.dumps({**throughput, "clients": args.clients, "b_over_a": round(ratio, 3)}))


if __name__ == "__main__":
    main()
