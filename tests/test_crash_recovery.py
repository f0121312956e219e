"""SIGKILL a real server in the middle of a bulk ingest; after a restart SQL and index agree."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from index import ClusteredIndex
from tests.conftest import SampleStore
from tests.helpers import topic_doc
from tests.server import Server, descendants, wait_gone

pytestmark = pytest.mark.slow

TOKEN = "crash-test-token"


def db_chunk_ids(data_dir: Path) -> np.ndarray:
    with sqlite3.connect(data_dir / "moerag.db") as conn:
        return np.array([r[0] for r in conn.execute("SELECT id FROM chunk ORDER BY id")], dtype=np.int64)


def index_on_disk(data_dir: Path) -> ClusteredIndex:
    with sqlite3.connect(data_dir / "moerag.db") as conn:
        (version,) = conn.execute("SELECT version FROM index_state WHERE id = 1").fetchone()
    [path] = (data_dir / "index").glob(f"ivf-{version}@*.faiss")  # one snapshot: the newest
    return ClusteredIndex.load(path, version)


def test_sigkill_mid_bulk_ingest_then_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    topics = ["sqlite", "git", "debian", "python"]
    files = [
        ("files", (f"{t}-{i}.md", topic_doc(t, i, paragraphs=6).encode(), "text/markdown"))
        for i in range(40)
        for t in topics
    ]
    server = Server(data_dir, TOKEN, tmp_path / "server.log", MOERAG_CHECKPOINT_SECONDS="1")
    try:
        client = server.start()
        job = client.post("/documents/bulk", files=files).json()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # wait until some, not all, documents are in
            state = client.get(f"/jobs/{job['id']}").json()
            if 0 < state["done"] < state["total"]:
                break
            assert state["status"] != "done", "ingest finished before it could be interrupted"
            time.sleep(0.05)
        server.kill()
        partial = len(db_chunk_ids(data_dir))
        assert partial > 0

        client = server.start()
        ready = client.get("/readyz").json()
        stats = client.get("/stats").json()
        assert stats["chunks"] == stats["index_vectors"]
        # The interrupted job resumes from its spooled files and finishes; nothing is lost or doubled.
        while (state := client.get(f"/jobs/{job['id']}").json())["status"] not in ("done", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert state["status"] == "done", state
        stats = client.get("/stats").json()
        assert stats["documents"] == len(files)
        assert stats["chunks"] == stats["index_vectors"] > partial
        assert ready["index"]["vectors"] <= stats["chunks"]

        # The same folder again through the CLI's --server mode adds nothing.
        folder = tmp_path / "again"
        folder.mkdir()
        for _, (name, data, _) in files[:20]:
            (folder / name).write_bytes(data)
        cmd = [
            sys.executable,
            "-m",
            "app.cli",
            "ingest",
            "--server",
            server.url,
            "--token",
            TOKEN,
            str(folder),
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
        assert '"created": 0' in out.stdout and '"duplicate": 20' in out.stdout
        server.stop()  # a clean stop checkpoints

        ids = db_chunk_ids(data_dir)
        ix_ids, _ = index_on_disk(data_dir).assignments()
        assert np.array_equal(ids, ix_ids)  # every indexed id resolves to a chunk, and back
        assert not any((data_dir / "spool").iterdir())
    finally:
        server.stop()


def test_sigkill_then_restart_with_sample_runs_the_job_once(tmp_path: Path) -> None:
    """Issue 11 #1: `serve --sample` on a non-empty store once started a second runtime that
    resumed the job, abandoned it at stop, and the serving runtime ran it again (chunks != vectors)."""
    data_dir = tmp_path / "data"
    files = [
        ("files", (f"{t}-{i}.md", topic_doc(t, i, paragraphs=6).encode(), "text/markdown"))
        for i in range(25)
        for t in ("sqlite", "git")
    ]
    server = Server(data_dir, TOKEN, tmp_path / "server.log", MOERAG_CHECKPOINT_SECONDS="1")
    try:
        client = server.start()
        job = client.post("/documents/bulk", files=files).json()
        deadline = time.monotonic() + 300
        while (state := client.get(f"/jobs/{job['id']}").json())["done"] < 5:
            assert state["status"] != "done", "ingest finished before it could be interrupted"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        server.kill()

        client = server.start(180, "--sample")
        while (state := client.get(f"/jobs/{job['id']}").json())["status"] not in ("done", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert state["status"] == "done", state
        stats = client.get("/stats").json()
        assert stats["documents"] == len(files)  # the sample was not added to a store that had documents
        assert stats["chunks"] == stats["index_vectors"]
        result = state["result"]
        assert result["created"] + result["duplicate"] == len(files) and result["failed"] == 0
        assert result["created"] >= 5  # the resumed run carried the first run's counts
        log = (tmp_path / "server.log").read_text()
        assert log.count(f"job {job['id']} (ingest) done") == 1
        assert log.count("moerag ready") == 2  # one runtime per start: --sample started none of its own
    finally:
        server.stop()


def test_serve_sample_answers_readyz_while_it_prepares(sample_store: SampleStore) -> None:
    """Issue 13: `serve --sample` on an empty store used to keep its port closed for the whole
    preparation (connection refused); now /readyz answers 503 "preparing", then "ready".
    The run's sample store is that preparation (`tests.server.serve_sample`)."""
    statuses = sample_store.readyz
    assert statuses[0] == "preparing" and statuses[-1] == "ready", statuses
    assert "ingesting the sample corpus" in sample_store.log


def test_a_sigkilled_server_leaves_no_process_behind(tmp_path: Path) -> None:
    """Issue 52 #5: the BM25 rebuild worker and multiprocessing's resource tracker outlived a
    SIGKILLed server (18 leftovers from 12 kills), holding its log file. Now every process the
    server started is gone within 5 s."""
    server = Server(tmp_path / "data", "tok", tmp_path / "server.log", MOERAG_CHECKPOINT_SECONDS="0.2")
    client = server.start(180)
    assert server.proc is not None
    try:
        upload = {"file": ("a.md", topic_doc("git", 1).encode(), "text/markdown")}
        assert client.post("/documents", files=upload).status_code == 201
        deadline = time.monotonic() + 60
        started = descendants(server.proc.pid)
        while len(started) < 2 and time.monotonic() < deadline:  # a rebuild worker and the tracker
            time.sleep(0.1)
            started = descendants(server.proc.pid)
        assert len(started) >= 2, started
        server.kill()
        assert wait_gone(started, 5.0) == [], "processes outlived their SIGKILLed server"
    finally:
        server.stop()
