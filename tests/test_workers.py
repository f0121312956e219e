"""`moerag serve --workers 2` on PostgreSQL: real worker processes behind one port, each with its own
replica of the index following the catalogue; a worker killed mid-ingest loses nothing.

Which worker answers a request is the kernel's choice; /readyz says its pid, so a test polls it
until it has heard every worker say the same thing.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from app.core.db import make_engine
from app.core.migrate import downgrade
from tests.helpers import TOPICS, topic_doc
from tests.server import Server, alive, descendants, wait_gone

PG_URL = os.environ.get("MOERAG_TEST_PG_URL")
pytestmark = pytest.mark.skipif(not PG_URL, reason="MOERAG_TEST_PG_URL not set")
WORKERS = 2
BULK = 150


def get(client: httpx.Client, path: str, seconds: float = 60.0) -> dict:  # type: ignore[type-arg]
    """GET on a fresh connection, retried while the worker that takes it is starting (or just died)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            r = client.get(path, headers={"Connection": "close"})
            if r.status_code == 200:
                return r.json()  # type: ignore[no-any-return]
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"GET {path} kept failing")
        time.sleep(0.1)


def every_worker(client: httpx.Client, read: Callable[[dict], object], want: object, seconds: float = 30.0) -> dict:  # type: ignore[type-arg]
    """{pid: read(/readyz)} once every worker has said `want` (fresh connections reach any worker)."""
    seen: dict[int, object] = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        body = get(client, "/readyz")
        seen[body["pid"]] = read(body)
        if len(seen) >= WORKERS and all(v == want for v in seen.values()):
            return seen
        time.sleep(0.01)
    raise AssertionError(f"not every worker says {want}: {seen}")


def replicas(client: httpx.Client, want: int, seconds: float = 30.0) -> dict:  # type: ignore[type-arg]
    """Every worker's replica holds `want` vectors."""
    return every_worker(client, lambda body: body["index"]["vectors"], want, seconds)


def all_documents(client: httpx.Client) -> list[dict]:  # type: ignore[type-arg]
    out: list[dict] = []  # type: ignore[type-arg]
    while page := get(client, f"/documents?offset={len(out)}&limit=500")["items"]:
        out += page
    return out


def concurrent_writes_and_questions(url: str, seconds: float) -> tuple[set[str], dict[str, int]]:
    """4 writer and 4 asker threads for `seconds`, each on fresh connections (any worker)."""
    acked: set[str] = set()
    counts = {"asked": 0, "written": 0, "5xx": 0}
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def writer(w: int) -> None:
        with httpx.Client(
            base_url=url, headers={"Authorization": "Bearer tok", "Connection": "close"}, timeout=60
        ) as c:
            i = 0
            while time.monotonic() < stop:
                source = f"w{w}-{i}.md"
                r = c.post(
                    "/documents", json={"text": topic_doc(list(TOPICS)[(w + i) % 4], 1000 * w + i, 2), "source": source}
                )
                with lock:
                    counts["5xx"] += r.status_code >= 500
                    if r.status_code == 201:
                        acked.add(source)
                        counts["written"] += 1
                i += 1

    def asker(a: int) -> None:
        with httpx.Client(base_url=url, headers={"Connection": "close"}, timeout=60) as c:
            while time.monotonic() < stop:
                r = c.post("/ask", json={"question": "how does a git rebase replay commits?"})
                with lock:
                    counts["5xx"] += r.status_code >= 500
                    counts["asked"] += r.status_code == 200

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    threads += [threading.Thread(target=asker, args=(a,)) for a in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return acked, counts


def test_workers_share_one_catalogue_and_survive_a_killed_worker(tmp_path: Path) -> None:
    assert PG_URL
    engine = make_engine(PG_URL)
    downgrade(engine, "base")
    engine.dispose()
    server = Server(
        tmp_path / "data",
        "tok",
        tmp_path / "server.log",
        MOERAG_DATABASE_URL=PG_URL,
        MOERAG_CATALOGUE_POLL_SECONDS="0.2",
        MOERAG_JOB_LEASE_SECONDS="2",
        MOERAG_CHECKPOINT_SECONDS="0.5",
        MOERAG_ROUTER_SAMPLES="200",
    )
    client = server.start(180, "--workers", str(WORKERS))
    try:
        replicas(client, 0, 120)  # every worker up
        lags = []
        for i, t in enumerate(TOPICS):
            r = client.post("/documents", json={"text": topic_doc(t, i, 3), "source": f"{t}.md"})
            assert r.status_code == 201, r.text
            acked = time.monotonic()
            replicas(client, client.get("/stats").json()["chunks"])
            lags.append(time.monotonic() - acked)
        assert max(lags) < 5.0, lags  # ingested through one worker, searchable through all
        hits = client.post("/search", json={"query": "git rebase branch", "k": 1}).json()["hits"]
        assert hits[0]["source"] == "git.md"

        # Router versions: activation and roll-back reach every worker.
        # Two lists, two experts: a gate needs two experts to route between.
        job = client.post("/admin/api/recluster", json={"clusters": 2}).json()["id"]
        while get(client, f"/jobs/{job}")["status"] not in ("done", "failed"):
            time.sleep(0.2)
        assert get(client, f"/jobs/{job}")["status"] == "done"
        for c, name in enumerate(("everything", "everything else")):
            expert = client.post("/admin/api/experts", json={"name": name}).json()["id"]
            client.post("/admin/api/clusters/assign", json={"cluster_ids": [c], "expert_id": expert})
        versions = []
        for _ in range(2):
            job = client.post("/admin/api/router/train", json={"activate": True, "force": True}).json()["id"]
            while get(client, f"/jobs/{job}")["status"] not in ("done", "failed"):
                time.sleep(0.2)
            versions.append(get(client, f"/jobs/{job}")["result"]["version"])
        for version in (versions[1], versions[0]):  # the newest, then a roll-back
            assert client.post(f"/admin/api/router/versions/{version}/activate").status_code == 200
            every_worker(client, lambda body: body["router"]["router_version"], version)

        doomed = client.get("/documents").json()["items"][0]["id"]
        assert client.delete(f"/documents/{doomed}").status_code == 200
        replicas(client, client.get("/stats").json()["chunks"])  # gone everywhere

        # Four writers and four askers at once, through whichever worker the kernel picks.
        acked, statuses = concurrent_writes_and_questions(
            server.url, float(os.environ.get("MOERAG_SOAK_SECONDS", "15"))
        )
        print(f"writers and askers: {statuses}, ingest-to-every-replica lags {[round(x, 3) for x in lags]} s")
        assert statuses["5xx"] == 0 and statuses["asked"] > 0, statuses
        sources = {d["source"] for d in all_documents(client)}
        assert acked <= sources, sorted(acked - sources)[:5]  # nothing acknowledged is lost
        replicas(client, get(client, "/stats")["chunks"], 60)

        # A bulk ingest, and each worker SIGKILLed in turn while it runs: the job's runner dies at
        # some point, another worker takes it over after the lease; nothing acknowledged is lost.
        files = [
            ("files", (f"bulk-{i}.md", topic_doc(list(TOPICS)[i % 4], 100 + i, 6).encode(), "text/markdown"))
            for i in range(BULK)
        ]
        job = client.post("/documents/bulk", files=files).json()["id"]
        killed: set[int] = set()
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            state = get(client, f"/jobs/{job}")
            if state["status"] in ("done", "failed"):
                break
            pid = get(client, "/readyz")["pid"]
            if pid and pid not in killed and state["done"] >= 10 + 30 * len(killed) and len(killed) < WORKERS:
                os.kill(pid, signal.SIGKILL)  # uvicorn starts a new worker in its place
                killed.add(pid)
            time.sleep(0.2)
        assert state["status"] == "done", state
        assert len(killed) == WORKERS
        total = get(client, "/documents")["total"]
        assert total == len(TOPICS) - 1 + len(acked) + BULK
        final = replicas(client, get(client, "/stats")["chunks"], 120)
        assert not killed & set(final)  # answered by the new workers, booted from snapshot + log
    finally:
        server.stop()


def _rotating_questions(url: str, n: int = 30) -> Counter[int]:
    with httpx.Client(base_url=url, timeout=60) as c:
        return Counter(
            c.post(
                "/ask", json={"question": "what is git?", "generate": False}, headers={"X-Forwarded-For": f"10.0.{i}.1"}
            ).status_code
            for i in range(n)
        )


def test_a_killed_supervisor_takes_its_workers_and_the_forwarded_header_needs_a_trusted_proxy(tmp_path: Path) -> None:
    """Issue 41 #3 and #5. A rotating X-Forwarded-For picked a new rate-limit bucket each question;
    now it counts only from a proxy named in MOERAG_TRUSTED_PROXIES. SIGKILL of a `--workers 2`
    supervisor left both workers serving as orphans (port taken, data-dir lock free); now they go
    within seconds, the lock is held while any of them lives, and the same command serves again."""
    from app.core.locking import DataDirBusy, DataDirLock, running_server

    assert PG_URL
    engine = make_engine(PG_URL)
    downgrade(engine, "base")
    engine.dispose()
    data = tmp_path / "data"
    env = {"MOERAG_DATABASE_URL": PG_URL, "MOERAG_ASK_RATE_PER_MINUTE": "20"}  # a burst of 4
    server = Server(data, "tok", tmp_path / "server.log", **env)
    client = server.start(180, "--workers", str(WORKERS))
    restarted: Server | None = None
    try:
        statuses = _rotating_questions(server.url)
        assert statuses[429] >= 25 and statuses[200] <= 5, statuses  # one client, one bucket

        workers = set(every_worker(client, lambda body: True, True))
        assert len(workers) == WORKERS
        stopped = next(iter(workers))
        os.kill(stopped, signal.SIGSTOP)  # it cannot stop yet: the lock must stay taken meanwhile
        server.kill()
        assert running_server(data) == server.url  # a CLI command is sent to the live worker
        with pytest.raises(DataDirBusy):
            DataDirLock(data).acquire()
        os.kill(stopped, signal.SIGCONT)
        deadline = time.monotonic() + 15
        while any(alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(p) for p in workers), "workers outlived their supervisor"
        with socket.socket() as s:  # the port is free again
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", server.port))
        assert running_server(data) is None

        restarted = Server(data, "tok", tmp_path / "restart.log", **env, MOERAG_TRUSTED_PROXIES="127.0.0.1")
        restarted.port, restarted.url = server.port, server.url
        restarted.start(180, "--workers", str(WORKERS))
        assert _rotating_questions(server.url) == {200: 30}  # a trusted proxy's header is the key
    finally:
        server.stop()
        if restarted is not None:
            restarted.stop()


def test_a_killed_worker_and_a_killed_supervisor_leave_no_process_behind(tmp_path: Path) -> None:
    """Issue 52 #5: a SIGKILLed worker's BM25 rebuild worker outlived it; after SIGKILL of the
    worker, then of the supervisor, no process either started is alive 5 s later."""
    assert PG_URL
    engine = make_engine(PG_URL)
    downgrade(engine, "base")
    engine.dispose()
    server = Server(tmp_path / "data", "tok", tmp_path / "server.log", MOERAG_DATABASE_URL=PG_URL)
    client = server.start(180, "--workers", str(WORKERS))
    assert server.proc is not None
    try:
        for i, topic in enumerate(list(TOPICS)[:2]):
            upload = {"file": (f"{topic}.md", topic_doc(topic, i).encode(), "text/markdown")}
            assert client.post("/documents", files=upload).status_code == 201
        workers = set(every_worker(client, lambda body: True, True))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(descendants(w) for w in workers):
            time.sleep(0.1)  # a worker's checkpoint starts its BM25 rebuild worker
        worker = next(w for w in workers if descendants(w))
        its_own = descendants(worker)
        os.kill(worker, signal.SIGKILL)
        assert wait_gone(its_own, 5.0) == [], "a killed worker's processes outlived it"

        everything = descendants(server.proc.pid)
        server.kill()
        assert wait_gone(everything, 5.0) == [], "processes outlived their SIGKILLed supervisor"
    finally:
        server.stop()
