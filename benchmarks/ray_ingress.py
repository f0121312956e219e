"""moerag's server as a Ray Serve deployment (app.shards.ingress) against `moerag serve`, both over the
same expert shards on a local Ray cluster, in one run:

    python benchmarks/ray_ingress.py --data-dir D --database-url postgresql+psycopg://...

D is a store whose catalogue is in PostgreSQL at the URL (`moerag db copy-to`); the evaluation
store's shard map is ray_scale.py's (python / postgresql + git + debian / sqlite + nodejs).
`moerag ray up` deploys the shards and one ingress replica behind Serve's HTTP proxy; `moerag serve`
runs beside it on the same map (its own data dir: the replicas share D), and another `moerag serve`
with the whole index and BM25 in its process (no shards). With both caches off, the FAQ dev
questions are asked over HTTP:

- one at a time, each question through the three in turn: latency p50 / p99 (the proxy's hop,
  the shards' hops), and whether the answers agree with the ingress's (route, first citation);
- each server process's resident memory after them (Linux /proc: the model in all three; the
  index and BM25 in the ones that hold them);
- `--clients` closed-loop clients for `--seconds`: questions a second through each, then through
  the ingress with two replicas (two cores saturate: say so).

Results: benchmarks/results/ray-ingress.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.evalcorpus import load_questions
from benchmarks.ray_embedder import closed_loop as asking

RESULTS = Path(__file__).resolve().parent / "results"
# The ingress on Ray, `moerag serve` over the same shards, `moerag serve` with the whole index (no shards).
SERVERS = ("ingress_on_ray_1_replica", "moerag_serve_over_the_shards", "moerag_serve_alone")
ROOT = Path(__file__).resolve().parent.parent
MAP = {
    "shards": [
        {"name": "python", "experts": ["python"]},
        {"name": "rest", "experts": ["postgresql", "git", "debian"], "default": True},
        {"name": "data", "experts": ["sqlite", "nodejs"]},
    ]
}


def moerag(*args: str, env: dict[str, str]) -> None:
    subprocess.run(
        [str(Path(sys.executable).with_name("moerag")), *args], check=True, env=env, stdout=subprocess.DEVNULL
    )


def wait_ready(url: str, within: float = 300) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} was not ready within {within:g} s")


def ask(http: httpx.Client, q: str) -> tuple[float, tuple[str, int | None]]:
    t = time.perf_counter()
    r = http.post("/ask", json={"query": q})
    ms = (time.perf_counter() - t) * 1000
    r.raise_for_status()
    body = r.json()
    return ms, (body["route"]["path"], body["citations"][0]["chunk_id"] if body["citations"] else None)


def closed_loop(url: str, questions: list[str], clients: int, seconds: float) -> float:
    """Questions a second, `clients` threads each asking the next question once its last is back
    (ray_embedder's loop, over one HTTP client with a connection a thread)."""
    with httpx.Client(base_url=url, timeout=60, limits=httpx.Limits(max_connections=clients)) as http:
        return asking(lambda q: ask(http, q), questions, clients, seconds)


def pct(ms: list[float]) -> dict[str, float]:
    return {"p50_ms": round(float(np.percentile(ms, 50)), 2), "p99_ms": round(float(np.percentile(ms, 99)), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--database-url", required=True)
    ap.add_argument("--port", type=int, default=8311, help="the ingress's; the two moerag serve take the next two")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=20)
    args = ap.parse_args()
    questions = [q["question"] for q in load_questions()]
    work = Path(tempfile.mkdtemp(prefix="moerag-ray-ingress-"))
    raw = MAP | {"ingress": {"replicas": 1, "port": args.port}}
    map_file = work / "shards.yaml"
    map_file.write_text(json.dumps(raw))
    base = {k: v for k, v in os.environ.items() if not k.startswith("MOERAG_")} | {
        "MOERAG_DATABASE_URL": args.database_url,
        "MOERAG_ANSWER_CACHE": "0",
        "MOERAG_QUESTION_CACHE": "0",
        "HF_HUB_OFFLINE": "1",
    }
    base_port = args.port
    urls = {name: f"http://127.0.0.1:{base_port + n}" for n, name in enumerate(SERVERS)}
    result: dict[str, Any] = {"command": "python benchmarks/ray_ingress.py " + " ".join(sys.argv[1:]),
                              "questions": len(questions), "cpus": os.cpu_count()}  # fmt: skip
    servers: list[subprocess.Popen[bytes]] = []
    try:
        t = time.monotonic()
        moerag("ray", "up", "--config", str(map_file), env=base | {"MOERAG_DATA_DIR": str(args.data_dir)})
        wait_ready(urls["ingress_on_ray_1_replica"])
        result["ray_up_s"] = round(time.monotonic() - t, 1)
        for n, (name, sharded) in enumerate([("moerag_serve_over_the_shards", True), ("moerag_serve_alone", False)]):
            data = work / f"serve-data-{n}"
            shutil.copytree(args.data_dir / "index", data / "index")  # its replica boots from the same snapshot
            env = base | {"MOERAG_DATA_DIR": str(data)} | ({"MOERAG_SHARD_MAP": str(map_file)} if sharded else {})
            cmd = [str(Path(sys.executable).with_name("moerag")), "serve", "--port", urls[name].rsplit(":", 1)[1]]
            servers.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_ready(urls[name])
        lat: dict[str, list[float]] = {name: [] for name in SERVERS}
        agree = dict.fromkeys(SERVERS[1:], 0)
        clients = {name: httpx.Client(base_url=url, timeout=60) for name, url in urls.items()}
        for q in questions[:20]:  # warm them
            for http in clients.values():
                ask(http, q)
        for q in questions:  # each question through each in turn
            answers = {}
            for name, http in clients.items():
                ms, answers[name] = ask(http, q)
                lat[name].append(ms)
            for name in SERVERS[1:]:
                agree[name] += answers[name] == answers[SERVERS[0]]
        for http in clients.values():
            http.close()
        result["one_at_a_time"] = {name: pct(ms) for name, ms in lat.items()}
        # What each server process holds after the questions (its model included, alike in all three).
        pids = {name: httpx.get(f"{url}/readyz", timeout=10).json()["pid"] for name, url in urls.items()}
        result["rss_mib_after_the_questions"] = {name: rss_mib(pid) for name, pid in pids.items()}
        result["same_route_and_first_citation_as_the_ingress"] = agree
        print(json.dumps(result), flush=True)
        rates = {name: closed_loop(url, questions, args.clients, args.seconds) for name, url in urls.items()}
        import ray

        from app.api.main import worker_app
        from app.core.settings import Settings
        from app.shards import ingress as ray_ingress
        from app.shards.map import IngressSpec

        ray.init(address="auto", log_to_driver=False)
        own = Settings(data_dir=args.data_dir, database_url=args.database_url)
        token = (args.data_dir / "admin_token").read_text().strip()
        os.environ.update({"MOERAG_ANSWER_CACHE": "0", "MOERAG_QUESTION_CACHE": "0"})
        ray_ingress.deploy(IngressSpec(2, port=args.port), ray_ingress.ingress_env(own, map_file, token), worker_app)
        wait_ready(urls["ingress_on_ray_1_replica"])
        rates["ingress_on_ray_2_replicas"] = closed_loop(urls["ingress_on_ray_1_replica"], questions, args.clients,
                                                         args.seconds)  # fmt: skip
        result[f"questions_a_second_{args.clients}_clients"] = rates
        print(json.dumps(result), flush=True)
    finally:
        for server in servers:
            server.send_signal(signal.SIGINT)
            server.wait(60)
        moerag("ray", "down", env=base | {"MOERAG_DATA_DIR": str(args.data_dir)})
        shutil.rmtree(work, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "ray-ingress.json").write_text(json.dumps(result, indent=2) + "\n")


def rss_mib(pid: int) -> float | None:
    """A process's resident memory (Linux /proc), MiB; None where it cannot be read."""
    try:
        line = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return None
    return round(int(line.split()[1]) / 1024, 1)


if __name__ == "__main__":
    main()
