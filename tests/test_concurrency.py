"""Issue 11: 8 uploaders and 8 askers against a real server: no 5xx, no reset, nothing acknowledged lost.

Before counting and encoding were made thread-safe, 4 + 4 of them gave `POST /documents` 500s
("Unable to create tensor") and a reset connection.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.helpers import TOPICS
from tests.server import Server

pytestmark = pytest.mark.slow

TOKEN = "concurrency-token"
SECONDS = float(os.environ.get("MOERAG_CONCURRENCY_SECONDS", "60"))


def test_uploaders_and_askers_at_once(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", TOKEN, tmp_path / "server.log")
    statuses: Counter[int] = Counter()
    errors: list[str] = []
    acknowledged: dict[int, str] = {}  # document id -> a sentence only it holds
    lock = threading.Lock()
    stop = time.monotonic() + SECONDS

    def uploader(worker: int) -> None:
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120) as c:
            n = 0
            while time.monotonic() < stop:
                n += 1
                marker = f"Marker {worker}x{n} zq{random.randrange(10**9)} appears once."
                length = random.choice((1, 5, 40))  # uneven lengths: the padding race needed them
                text = f"{marker} " + " ".join([TOPICS[random.choice(list(TOPICS))]] * length)
                try:
                    r = c.post("/documents", json={"text": text, "title": f"w{worker} n{n}"})
                except httpx.TransportError as exc:
                    errors.append(f"upload: {exc!r}")
                    continue
                with lock:
                    statuses[r.status_code] += 1
                    if r.status_code == 201:
                        acknowledged[r.json()["id"]] = marker

    def asker(worker: int) -> None:
        with httpx.Client(base_url=server.url, timeout=120) as c:
            while time.monotonic() < stop:
                question = random.choice(["How does the write-ahead log work?", "What is a git branch?", "apt?"])
                try:
                    r = c.post("/ask", json={"question": question, "top_k": random.choice((1, 5, 10))})
                except httpx.TransportError as exc:
                    errors.append(f"ask: {exc!r}")
                    continue
                with lock:
                    statuses[r.status_code] += 1

    try:
        client = server.start()
        threads = [threading.Thread(target=uploader, args=(i,)) for i in range(8)]
        threads += [threading.Thread(target=asker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[:5]
        assert not [s for s in statuses if s >= 500], statuses
        assert statuses[201] > 0 and statuses[200] > 0, statuses
        for doc_id, marker in random.Random(0).sample(sorted(acknowledged.items()), min(20, len(acknowledged))):
            detail = client.get(f"/documents/{doc_id}")
            assert detail.status_code == 200
            first = client.get(f"/chunks/{detail.json()['chunk_list'][0]['id']}").json()["text"]
            assert marker in first
            hits = client.post("/search", json={"query": first, "k": 10}).json()["hits"]  # its own text
            assert doc_id in [h["document_id"] for h in hits], (doc_id, marker)
        stats = client.get("/stats").json()
        assert stats["documents"] == len(acknowledged) and stats["chunks"] == stats["index_vectors"]
    finally:
        server.stop()
