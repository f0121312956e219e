"""Issue 11: a real full disk, not a mocked ENOSPC: the data dir on a small tmpfs, filled while a
live server ingests. Writes that do not fit are refused with a JSON 507 (they were a plain 500
and a reset connection), reads and answers go on, an index checkpoint that does not fit fails and
is retried, and after a kill -9 and a restart with room again, every acknowledged document is
there and found by its own text, with chunks == vectors.

(tests/test_startup_consistency.py covers the same checkpoint with ENOSPC injected, on any machine.)
"""

from __future__ import annotations

import errno
import random
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server import Server

pytestmark = pytest.mark.slow

TOKEN = "full-disk-token"
WORDS = "harbour lantern quartz meadow falcon copper willow ember glacier saffron tundra velvet".split()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs (mounting needs root: CI and these machines run as root)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(mount: Path, leave: int) -> Path:
    """A ballast file that leaves about `leave` bytes free on the mount."""
    ballast = mount / "ballast"
    with open(ballast, "wb") as f:
        try:
            while (free := shutil.disk_usage(mount).free) > leave:
                f.write(b"\0" * min(1 << 20, max(4096, free - leave)))
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return ballast


def index_bytes(data_dir: Path) -> int:
    return max((p.stat().st_size for p in (data_dir / "index").rglob("*") if p.is_file()), default=0)


def test_a_full_disk_refuses_writes_cleanly_and_loses_nothing_acknowledged(small_disk: Path, tmp_path: Path) -> None:
    data_dir, log = small_disk / "data", tmp_path / "server.log"
    server = Server(data_dir, TOKEN, log, MOERAG_CHECKPOINT_SECONDS="1")
    rng = random.Random(11)
    acknowledged: dict[int, str] = {}  # document id -> its first paragraph

    def upload(c: httpx.Client, i: int) -> int:
        paragraphs = [f"Record {i}.{p}: " + " ".join(rng.choice(WORDS) for _ in range(120)) for p in range(20)]
        r = c.post("/documents", json={"text": "\n\n".join(paragraphs), "title": f"record {i}"})
        if r.status_code in (200, 201):
            acknowledged[r.json()["id"]] = paragraphs[0]
        else:
            assert r.status_code == 507 and r.json()["error"]["code"] == "disk_full", r.text
        return r.status_code

    try:
        c = server.start()
        assert all(upload(c, i) == 201 for i in range(20))
        deadline = time.monotonic() + 30
        while c.get("/stats").json()["index_vectors"] < 20 or index_bytes(data_dir) == 0:
            assert time.monotonic() < deadline, "no checkpoint written"
            time.sleep(0.5)
        time.sleep(2)  # the checkpoint of the last upload
        snapshot = index_bytes(data_dir)
        # Room for a few uploads' rows, not for the next index snapshot.
        ballast = fill(small_disk, leave=snapshot // 2)
        statuses = Counter(upload(c, i) for i in range(20, 40))
        assert statuses[507] > 0, statuses
        time.sleep(3)  # checkpoints come round and do not fit
        # Reads and answers go on while the disk is full.
        assert c.get("/documents").status_code == 200
        ask = c.post("/ask", json={"query": "harbour lantern quartz"})
        assert ask.status_code == 200 and ask.json()["citations"], ask.text
        server.kill()  # no clean stop, no last checkpoint
        ballast.unlink()

        c = server.start()
        stats = c.get("/stats").json()
        assert stats["documents"] == len(acknowledged), (stats, statuses)
        assert stats["chunks"] == stats["index_vectors"], stats
        for doc_id, first in acknowledged.items():
            hits = c.post("/search", json={"query": first, "k": 3}).json()["hits"]
            assert doc_id in {h["document_id"] for h in hits}, doc_id
        assert "Internal Server Error" not in log.read_text()
    finally:
        server.stop()
