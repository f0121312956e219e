"""/ask under concurrent load, service to service: moerag with and without batching, the LangChain peer.

    python benchmarks/load.py --data-dir DATA_DIR --langchain LANGCHAIN_DIR \\
        --clients 1 2 4 8 16 --seconds 15 --rounds 3

In one run, on this machine, for every target and client count: throughput (requests/s) and
p50/p95/p99 latency, with the load generator's own CPU share (it runs on the same cores).
Targets, each its own server process on 127.0.0.1, all started first; at each client count they
take turns, `--rounds` times (each round in a rotated order), one loaded at a time:

- moerag, batching: `moerag serve` as shipped (extractive answers, so the figures are moerag's
  own cost, not an LLM's), the question cache off: the dev questions cycle, and a cache would
  answer repeats without the model. A last row turns it on to show what repeats cost.
- moerag, no batching: MOERAG_QUESTION_BATCH=1.
- moerag, 2 torch threads: batching with MOERAG_TORCH_THREADS=2 (the default is one).
- moerag, a lone question on one thread: MOERAG_QUESTION_LONE_THREADS=1 (the default runs a
  question asked while no other is answered on every core).
- LangChain server (benchmarks/peer_server.py): the same model in the same dtype, FAISS flat,
  FastAPI + uvicorn, one route returning the top 10; torch's default threads, then one thread.

Also measured in-process before the servers start: a bare `encode` + exact FAISS search of the
same questions (the floor for one client, the better of one thread and every core; again before
each round's one-client turns, kept in those rows as `bare_p50_ms`, which
`p50_at_1_client_over_bare_ms` sets them against), and what batching in bfloat16 does to the
top 10.
`ratio_at_8_clients` = moerag with batching / the faster LangChain server of the same round, at 8
clients (the median over rounds; each round's in `ratio_at_8_clients_by_round`).
`p95_8_over_p95_1` stands beside `mean_latency_8_over_1_by_littles_law` = 8 x one client's
throughput / eight clients' (medians): the ratio of mean latencies the throughputs force on
clients that ask again as soon as they are answered.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import percentile, write_result
from benchmarks.evalcorpus import load_questions
from tests.server import Server, free_port  # the same `moerag serve` launcher the crash-recovery tests use

RESULTS = Path(__file__).resolve().parent / "results"


class TransportError(Exception):
    """A request that got no HTTP answer (its message: the client library's exception name)."""


Post = Callable[[str], Awaitable[tuple[int, bytes]]]  # question -> (HTTP status, body)
HTTP_CLIENTS = ("aiohttp", "httpx")  # the load generator's HTTP client; the first is the default


@contextlib.asynccontextmanager
async def _poster(url: str, clients: int, http_client: str) -> AsyncIterator[Post]:
    """post(question) -> (status, body) over `clients` kept-alive connections; raises `TransportError`.

    aiohttp by default: its C parser costs the load generator ~0.7 ms of CPU an /ask against
    httpx's ~2.2 ms, time inside every measured latency and taken from the served cores
    (`benchmarks/results/load-f32-http-clients.json`). httpx stays for comparison with earlier runs.
    """
    if http_client == "httpx":
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:

            async def post_httpx(q: str) -> tuple[int, bytes]:
                try:
                    r = await http.post("/ask", json={"question": q})
                except httpx.HTTPError as exc:
                    raise TransportError(type(exc).__name__) from exc
                return r.status_code, r.content

            yield post_httpx
        return
    if http_client != "aiohttp":
        raise ValueError(f"http_client must be one of {HTTP_CLIENTS}, not {http_client!r}")
    import aiohttp  # the `bench` extra

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(url, connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def post_aiohttp(q: str) -> tuple[int, bytes]:
            try:
                async with session.post("/ask", json={"question": q}) as r:
                    return r.status, await r.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise TransportError(type(exc).__name__) from exc

        yield post_aiohttp


async def load_level(
    url: str,
    questions: list[str],
    clients: int,
    seconds: float,
    requests: int | None = None,
    http_client: str = HTTP_CLIENTS[0],
) -> dict[str, Any]:
    """`clients` closed-loop clients (one request in flight each) for `seconds` (or `requests` sent), one loop."""
    feed = itertools.islice(itertools.cycle(questions), requests) if requests else itertools.cycle(questions)
    latencies: list[float] = []
    stage_ms: dict[str, list[float]] = {"embed": [], "route": [], "retrieve": []}  # moerag's own timings
    paths: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    async with _poster(url, clients, http_client) as post:
        for q in questions[:3]:  # warm-up outside the measurement: lazy imports, first connections
            await post(q)
        deadline = time.monotonic() + seconds

        async def client() -> None:
            while time.monotonic() < deadline and (q := next(feed, None)) is not None:
                t = time.perf_counter()
                try:
                    status, content = await post(q)
                except TransportError as exc:
                    errors[str(exc)] += 1
                    continue
                ms = (time.perf_counter() - t) * 1000
                if status != 200:
                    errors[str(status)] += 1
                    continue
                latencies.append(ms)
                body = json.loads(content)
                if "route" in body:  # moerag
                    paths[body["route"]["path"]] += 1
                    for stage, values in stage_ms.items():
                        values.append(body["timings_ms"].get(stage, 0.0))

        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    latencies.sort()
    return {
        "clients": clients,
        "http_client": http_client,
        "requests": len(latencies),
        "errors": dict(errors),
        "seconds": round(elapsed, 1),
        "throughput_rps": round(len(latencies) / elapsed, 2),
        "p50_ms": percentile(latencies, 50),
        "p95_ms": percentile(latencies, 95),
        "p99_ms": percentile(latencies, 99),
        **{f"{stage}_ms_mean": round(statistics.mean(v), 2) if v else None for stage, v in stage_ms.items()},
        "paths": dict(paths),
        "loadgen_cpu_share": round(cpu / (elapsed * (os.cpu_count() or 1)), 3),  # of the whole machine
        "loadgen_cpu_ms_per_request": round(cpu * 1000 / len(latencies), 2) if latencies else None,
    }


class PeerServer:
    """benchmarks/peer_server.py in its own process, ready when /readyz answers."""

    def __init__(self, store: Path, log: Path, dtype: str, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, str(Path(__file__).with_name("peer_server.py")), "--store", str(store)]
        self.cmd = [*cmd, "--port", str(self.port), "--dtype", dtype]
        self.env, self.log = {**os.environ, **env}, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 300) -> None:
        out = open(self.log, "ab")  # noqa: SIM115 - owned by the child process
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"peer server exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise TimeoutError("peer server not ready")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


class BareFloor:
    """In-process `encode_questions` + exact FAISS search over moerag's index: one client's floor,
    with the question model compiled as the server compiles it (`MOERAG_QUESTION_RUNTIME=auto`).

    Built once; `p50_ms` measures it again whenever asked, so each round's one-client rows can be
    set against a floor taken next to them.
    """

    def __init__(self, data_dir: Path) -> None:
        from engine.embedder import Embedder
        from index import ClusteredIndex

        path = max((data_dir / "index").glob("ivf-*.faiss"), key=lambda p: p.stat().st_mtime)
        self.index = ClusteredIndex.load(path, path.stem)
        self.emb = Embedder()
        # The question model the server runs, with its session for a lone question on every core.
        self.runtime = self.emb.compile_questions("auto", wide_threads=os.cpu_count() or 1)

    def p50_ms(self, questions: list[str], threads: int = 1) -> float:
        """Median ms of one question, encode + exact search, over the first 100 (after 5 warm-ups);
        threads > 1: torch, FAISS and (ONNX Runtime's wide session) the model on that many."""
        import faiss
        import torch

        torch.set_num_threads(threads)
        faiss.omp_set_num_threads(threads)
        wide = threads > 1
        for q in questions[:5]:
            self.index.search(self.emb.encode_questions([q], wide=wide), 10)
        ms = []
        for q in questions[:100]:
            t = time.perf_counter()
            self.index.search(self.emb.encode_questions([q], wide=wide), 10)
            ms.append((time.perf_counter() - t) * 1000)
        torch.set_num_threads(1)
        faiss.omp_set_num_threads(1)
        return percentile(sorted(ms), 50)

    def best_p50_ms(self, questions: list[str]) -> float:
        """The floor: the better median of one thread and every core."""
        return min(self.p50_ms(questions, threads) for threads in sorted({1, os.cpu_count() or 1}))

    def report(self, questions: list[str]) -> dict[str, Any]:
        """The floor at one thread and at every core, and what batching in the serving dtype does to
        the top 10 (groups of 8 as under load, against one question at a time)."""
        import numpy as np

        emb, index = self.emb, self.index
        out: dict[str, Any] = {"dtype": emb.dtype_name, "question_model": self.runtime, "vectors": index.ntotal}
        for threads in (1, os.cpu_count() or 1):
            out[f"p50_ms_{threads}_threads"] = self.p50_ms(questions, threads)
        out["p50_ms"] = min(v for k, v in out.items() if k.startswith("p50_ms_"))
        single = np.vstack([emb.encode_questions([q]) for q in questions])  # [Q, D]
        batched = np.vstack([emb.encode_questions(questions[i : i + 8]) for i in range(0, len(questions), 8)])
        s1, i1 = index.search(single, 10)
        s8, i8 = index.search(batched, 10)
        out["batching_in_" + emb.dtype_name] = {
            "questions": len(questions),
            "vector_max_abs_diff": float(np.abs(single - batched).max()),
            "top10_same_order": int((i1 == i8).all(axis=1).sum()),
            "top10_same_set": int(sum(set(a) == set(b) for a, b in zip(i1.tolist(), i8.tolist(), strict=True))),
            "top1_same": int((i1[:, 0] == i8[:, 0]).sum()),
            "score_max_abs_diff": float(np.abs(s1 - s8).max()),
        }
        return out


NO_CACHE = {"MOERAG_QUESTION_CACHE": "0", "MOERAG_ANSWER_CACHE": "0"}
MOERAG_TARGETS: dict[str, dict[str, str]] = {
    "moerag, batching": NO_CACHE,
    "moerag, no batching": {**NO_CACHE, "MOERAG_QUESTION_BATCH": "1"},
    "moerag, batching, 2 torch threads": {**NO_CACHE, "MOERAG_TORCH_THREADS": "2"},
    "moerag, batching, a lone question on one thread": {**NO_CACHE, "MOERAG_QUESTION_LONE_THREADS": "1"},
    "moerag, batching + question cache": {"MOERAG_ANSWER_CACHE": "0"},
    "moerag, batching + question and answer caches": {},
}
WORKER_COUNTS = (1, 2, 4)  # `moerag serve --workers N` on PostgreSQL (--pg-url: a copy of the store)


def worker_target(n: int) -> str:
    return f"moerag, PostgreSQL, {n} worker{'s' if n > 1 else ''}"


PEER_TARGETS: dict[str, dict[str, str]] = {
    "LangChain server": {},
    "LangChain server, 1 torch thread": {"OMP_NUM_THREADS": "1"},
}


def run(
    data_dir: Path,
    clients: list[int],
    seconds: float,
    log: Path,
    questions: list[str],
    *,
    langchain: Path | None = None,
    requests: int | None = None,
    targets: list[str] | None = None,
    pg_url: str | None = None,
    rounds: int = 1,
    http_clients: tuple[str, ...] = HTTP_CLIENTS[:1],
) -> dict[str, Any]:
    """Every target (default: all; LangChain ones need `langchain`, worker ones `pg_url`) at every
    client count, `rounds` times.

    Every target's server is started first and stays up (idle between its turns), and the
    targets take turns at each client count, round by round (each round in a rotated order): a
    ratio between two targets compares measurements seconds apart, not a target measured minutes
    after another while the shared machine's load drifted. The price: every server's memory at
    once, and a copy of the store on disk for each moerag target after the first.

    With several `http_clients`, every target's turn runs once with each (rows carry
    `http_client`); the summary is the first one's, and `by_http_client` holds each one's.
    """
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    workers = [worker_target(n) for n in WORKER_COUNTS] if pg_url else []
    wanted = targets or [*MOERAG_TARGETS, *(PEER_TARGETS if langchain else {}), *workers]
    result: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "seconds_per_level": seconds,
        "rounds": rounds,
        "questions": len(questions),
        "http_clients": list(http_clients),
    }
    print("bare encode + search, in process ...", flush=True)
    floor = BareFloor(data_dir)
    bare = result["bare_encode_search"] = floor.report(questions)
    print(json.dumps(bare), flush=True)
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as servers:
        # One process holds a data dir: every moerag target after the first serves a copy, made
        # before any server starts (a server writes to its store as it starts).
        local = [name for name in wanted if name in MOERAG_TARGETS]
        stores = {name: _copy(data_dir, servers) if name != local[0] else data_dir for name in local}
        urls: dict[str, str] = {}
        for name in wanted:
            print(f"starting {name} ...", flush=True)
            store = stores.get(name, data_dir)
            label, urls[label] = _start(name, store, log, bare["dtype"], langchain, pg_url, servers)
        labels = list(urls)
        for c in clients:
            for r in range(rounds):
                # One client: the floor again, next to this round's rows, and carried by each of them.
                here = {"bare_p50_ms": floor.best_p50_ms(questions)} if c == 1 else {}
                for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
                    for lib in http_clients:
                        print(f"load: {label}, {c} client(s), round {r + 1}, {lib} ...", flush=True)
                        level = asyncio.run(load_level(urls[label], questions, c, seconds, requests, lib))
                        rows.append({"target": label, "round": r + 1, **level, **here})
                        print(json.dumps(rows[-1]), flush=True)
    result["levels"] = rows
    by_client = {lib: summary([r for r in rows if r["http_client"] == lib], bare) for lib in http_clients}
    result.update(by_client[http_clients[0]])
    if len(http_clients) > 1:
        result["by_http_client"] = by_client
    return result


def _copy(data_dir: Path, cleanup: contextlib.ExitStack) -> Path:
    """A copy of the store beside it (without its lock file), removed when `cleanup` closes."""
    copy = Path(tempfile.mkdtemp(prefix="load-", dir=data_dir.parent))
    cleanup.callback(shutil.rmtree, copy, True)
    shutil.copytree(data_dir, copy, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".lock"))
    return copy


def _start(
    name: str,
    data_dir: Path,
    log: Path,
    dtype: str,
    langchain: Path | None,
    pg_url: str | None,
    servers: contextlib.ExitStack,
) -> tuple[str, str]:
    """Start one target's server, stopped when `servers` closes: (its label in the rows, its URL)."""
    if name.startswith("moerag, PostgreSQL"):
        if pg_url is None:
            raise ValueError(f"target {name!r} needs --pg-url")
        n = int(name.split(", ")[-1].split()[0])
        # Its own data dir: each worker builds its replica from SQL, none writes into the SQLite store's.
        server = Server(data_dir.parent / f"load-pg-{n}", "bench-load", log, MOERAG_DATABASE_URL=pg_url, **NO_CACHE)
        servers.callback(server.stop)
        server.start(600, "--workers", str(n)).close()
        return name, server.url
    if name in MOERAG_TARGETS:
        server = Server(data_dir, "bench-load", log, **MOERAG_TARGETS[name])
        servers.callback(server.stop)
        server.start(timeout=600).close()
        return name, server.url
    if langchain is None:
        raise ValueError(f"target {name!r} needs a LangChain store")
    peer = PeerServer(langchain, log, dtype, **PEER_TARGETS[name])
    servers.callback(peer.stop)
    peer.start()
    return f"{name} ({dtype})", peer.url


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True, help="an ingested moerag data dir (served as it is)")
    ap.add_argument("--langchain", type=Path, help="a store from `peers.py langchain-build` (omit: no peer rows)")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--seconds", type=float, default=15, help="per target and client count")
    ap.add_argument("--requests", type=int, help="also stop a level after this many requests")
    ap.add_argument("--rounds", type=int, default=1, help="times each target runs each client count, in turns")
    ap.add_argument(
        "--targets",
        nargs="+",
        choices=[*MOERAG_TARGETS, *PEER_TARGETS, *(worker_target(n) for n in WORKER_COUNTS)],
        help="default: all",
    )
    ap.add_argument("--pg-url", help="PostgreSQL holding a copy of the store (`moerag db copy-to`): worker rows")
    ap.add_argument(
        "--http-client",
        nargs="+",
        choices=HTTP_CLIENTS,
        default=HTTP_CLIENTS[:1],
        help="the load generator's HTTP client; several: each level with each, in turns (the summary is the first's)",
    )
    ap.add_argument("--log", type=Path, default=Path("load-servers.log"))
    ap.add_argument("--name", default="load", help="results file stem under benchmarks/results/")
    args = ap.parse_args()
    questions = [q["question"] for q in load_questions()]
    result = {"command": "python benchmarks/load.py " + " ".join(sys.argv[1:])}
    result |= run(
        args.data_dir,
        args.clients,
        args.seconds,
        args.log,
        questions,
        langchain=args.langchain,
        requests=args.requests,
        targets=args.targets,
        pg_url=args.pg_url,
        rounds=args.rounds,
        http_clients=tuple(args.http_client),
    )
    RESULTS.mkdir(exist_ok=True)
    write_result(RESULTS / f"{args.name}.json", result)
    print(json.dumps({k: v for k, v in result.items() if k != "levels"}, indent=2))


def summary(rows: list[dict[str, Any]], bare: dict[str, Any]) -> dict[str, Any]:
    """The issue's aims, from the rows: a figure over several rounds is their median, and a
    comparison is taken round by round before its median is: the throughput ratio (moerag against
    the faster LangChain server of the same round) and the one-client p50 over the bare floor
    (each one-client row's `bare_p50_ms`, measured in its round; `bare["p50_ms"]`, taken before
    the servers, for a row without one)."""
    by: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["target"], r["clients"]), []).append(r)

    def median(target: str, clients: int, key: str) -> float | None:
        values = [r[key] for r in by.get((target, clients), [])]
        return statistics.median(values) if values else None

    out: dict[str, Any] = {}
    ratios, against = [], Counter[str]()
    for m in by.get(("moerag, batching", 8), []):
        peers = [
            r for r in rows if r["target"].startswith("LangChain") and r["clients"] == 8 and r["round"] == m["round"]
        ]
        best = max(peers, key=lambda r: r["throughput_rps"], default=None)
        if best is not None and best["throughput_rps"] > 0:
            ratios.append(m["throughput_rps"] / best["throughput_rps"])
            against[best["target"]] += 1
    if ratios:
        out["ratio_at_8_clients"] = round(statistics.median(ratios), 2)
        out["ratio_at_8_clients_by_round"] = [round(x, 2) for x in ratios]
        out["ratio_at_8_clients_against"] = against.most_common(1)[0][0]
    over = [r["p50_ms"] - r.get("bare_p50_ms", bare["p50_ms"]) for r in by.get(("moerag, batching", 1), [])]
    if over:
        out["p50_at_1_client_over_bare_ms"] = round(statistics.median(over), 2)
    m1_p95, m8_p95 = median("moerag, batching", 1, "p95_ms"), median("moerag, batching", 8, "p95_ms")
    if m1_p95 and m8_p95 is not None:
        out["p95_8_over_p95_1"] = round(m8_p95 / m1_p95, 2)
    x1, x8 = median("moerag, batching", 1, "throughput_rps"), median("moerag, batching", 8, "throughput_rps")
    if x1 and x8:
        # Little's law for closed-loop clients that send again at once: mean latency = clients /
        # throughput, so the throughputs alone fix the mean latencies' ratio, 8 x1 / x8. Bringing
        # it to 2 takes x8 >= 4 x1; with c CPU-seconds a request, x8 <= cores / c, so on two cores
        # a lone request must spend at least 2c of wall time: keep the cores a quarter busy at most.
        out["throughput_8_over_1"] = round(x8 / x1, 2)
        out["mean_latency_8_over_1_by_littles_law"] = round(8 * x1 / x8, 2)
    best_by_workers = {
        n: max((r["throughput_rps"] for r in rows if r["target"] == worker_target(n)), default=None)
        for n in WORKER_COUNTS
    }
    if any(best_by_workers.values()):
        out["best_throughput_by_workers"] = {str(n): v for n, v in best_by_workers.items() if v is not None}
    return out


def ab_main(argv: list[str]) -> None:
    """`ab`: a/B of /ask throughput between two checkouts of moerag, alternating, in one run.

        git worktree add BEFORE_DIR <commit>        # A: the code before a change
        python benchmarks/load.py ab --a BEFORE_DIR --data-a AB_A_DIR \\
            --b . --data-b AB_B_DIR --clients 8 --seconds 20 --rounds 2

    Each round starts A's server, loads it, stops it, then B's, so both see the same machine noise
    (rounds alternate A, B, A, B). Each checkout serves its own data dir (copies of one store:
    a newer checkout migrates its copy forward, which the older one could not read). Question and
    answer caches are off, as in the load run above, whose load generator this reuses. Prints one
    JSON line per measurement and a summary {"A": [req/s ...], "B": [...], "b_over_a": ratio of means}.
    """
    ap = argparse.ArgumentParser(
        prog="load.py ab", description=ab_main.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--a", type=Path, required=True, help="checkout A (its `app` package is served)")
    ap.add_argument("--data-a", type=Path, required=True)
    ap.add_argument("--b", type=Path, required=True, help="checkout B")
    ap.add_argument("--data-b", type=Path, required=True)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--questions", type=Path, help="default: ../shared/eval/faq-dev.jsonl")
    ap.add_argument("--log", type=Path, default=Path("ab-servers.log"))
    args = ap.parse_args(argv)

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
    if sys.argv[1:2] == ["ab"]:
        ab_main(sys.argv[2:])
    else:
        main()
