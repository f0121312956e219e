"""At start-up an index that does not match SQL is rebuilt from stored embeddings, never trusted."""

import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete, select, update

from app.api.main import create_app
from app.clustering.indexing import ModelMismatch
from app.core.models import Chunk, IndexState
from app.core.settings import Settings
from app.runtime import Runtime
from app.services.documents import Upload
from engine.embedder import Embedder
from tests.helpers import topic_doc


def fill(settings: Settings, embedder: Embedder) -> Path:
    rt = Runtime(settings, embedder=embedder)
    rt.start()
    for i, t in enumerate(["sqlite", "git", "debian", "python"] * 2):
        rt.ingestor.ingest(Upload(data=topic_doc(t, i).encode(), source=f"{t}-{i}.md", filename=f"{t}-{i}.md"))
    indexes, version = rt.indexes, rt.indexes.index.version
    rt.close()  # checkpoints: a snapshot named by clustering version and catalogue position
    [(position, where)] = indexes.snapshots(version)
    path = Path(where)
    assert path.exists() and position == indexes.position > 0
    return path


def reopen(settings: Settings, embedder: Embedder) -> Runtime:
    rt = Runtime(settings, embedder=embedder)
    rt.start()
    return rt


def assert_consistent(rt: Runtime) -> None:
    with rt.sessions() as s:
        db_ids = np.array(sorted(s.scalars(select(Chunk.id))), dtype=np.int64)
    ix_ids, _ = rt.indexes.index.assignments()
    assert np.array_equal(db_ids, ix_ids)


def test_clean_restart_trusts_the_file(settings: Settings, embedder: Embedder) -> None:
    fill(settings, embedder)
    rt = reopen(settings, embedder)
    try:
        assert rt.index_status == "loaded"
        assert_consistent(rt)
    finally:
        rt.close()


@pytest.mark.parametrize("damage", ["missing", "truncated", "garbage"])
def test_damaged_file_is_rebuilt(settings: Settings, embedder: Embedder, damage: str) -> None:
    path = fill(settings, embedder)
    if damage == "missing":
        path.unlink()
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        path.write_bytes(b"\x00" * 4096)
    rt = reopen(settings, embedder)
    try:
        assert rt.index_status.startswith("rebuilt")
        assert_consistent(rt)
        assert rt.stats()["chunks"] > 0
    finally:
        rt.close()


def test_rows_changed_behind_the_index_are_detected(settings: Settings, embedder: Embedder) -> None:
    fill(settings, embedder)
    rt = Runtime(settings, embedder=embedder)
    with rt.sessions.begin() as s:  # as if a crash hit between the SQL commit and the index write
        first = s.scalars(select(Chunk.id).order_by(Chunk.id)).first()
        s.execute(delete(Chunk).where(Chunk.id == first))
        s.execute(update(Chunk).where(Chunk.id == first + 1).values(cluster_id=0))
    rt.start()
    try:
        assert rt.index_status.startswith("rebuilt")
        assert_consistent(rt)
    finally:
        rt.close()


def test_model_mismatch_is_a_clear_error_not_a_crash_loop(settings: Settings, embedder: Embedder) -> None:
    fill(settings, embedder)
    rt = Runtime(settings, embedder=embedder)
    with rt.sessions.begin() as s:
        s.execute(update(IndexState).values(model="some-other-model"))
    with pytest.raises(ModelMismatch, match="some-other-model"):
        rt.start()
    rt.close()
    app = create_app(settings, runtime=Runtime(settings, embedder=embedder))
    with TestClient(app) as client:
        deadline = 100
        while deadline and client.get("/readyz").json().get("status") == "starting":
            time.sleep(0.1)
            deadline -= 1
        r = client.get("/readyz")
        assert r.status_code == 503 and "some-other-model" in r.json()["error"]
        assert client.get("/healthz").status_code == 200
        assert client.get("/documents").status_code == 503


def test_a_full_disk_at_a_checkpoint_loses_nothing(
    settings: Settings, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 11: the checkpoint cleared its dirty flag before writing; a failed write was never retried."""
    import errno

    from app.store import snapshots

    path = fill(settings, embedder)
    rt = reopen(settings, embedder)
    try:
        real_write = snapshots.write_atomic

        def disk_full(*_: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(snapshots, "write_atomic", disk_full)
        outcome = rt.ingestor.ingest(Upload(data=topic_doc("git", 99).encode(), source="late.md", filename="late.md"))
        assert outcome.status == "created"  # acknowledged: SQL has it
        with pytest.raises(OSError):
            rt.indexes.checkpoint()
        monkeypatch.setattr(snapshots, "write_atomic", real_write)  # the disk has room again
        assert rt.indexes.checkpoint() is True  # written now, not skipped as clean
        assert_consistent(rt)
    finally:
        rt.close()
    rt = reopen(settings, embedder)
    try:
        assert rt.index_status == "loaded"  # the file on disk already held the late document
        assert_consistent(rt)
        [(_, newest)] = rt.indexes.snapshots(rt.indexes.index.version)  # the old one replaced
        assert Path(newest) != path and not path.exists() and rt.stats()["documents"] == 9
    finally:
        rt.close()


def test_a_checkpoint_returns_only_once_a_snapshot_being_written_is_on_disk(
    settings: Settings, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI, stop 23: the checkpoint thread had taken the changes and was still writing when an explicit
    checkpoint found nothing dirty and returned; the caller then saw a half-written snapshot and the
    stale one beside it. A second checkpoint now waits for the first."""
    import threading

    from app.store import snapshots

    fill(settings, embedder)
    rt = reopen(settings, embedder)
    try:
        real_write, entered, release = snapshots.write_atomic, threading.Event(), threading.Event()

        def slow_write(*args: object) -> None:
            entered.set()
            assert release.wait(10)
            real_write(*args)  # type: ignore[arg-type]

        monkeypatch.setattr(snapshots, "write_atomic", slow_write)
        rt.ingestor.ingest(Upload(data=topic_doc("git", 98).encode(), source="late.md", filename="late.md"))
        first = threading.Thread(target=rt.indexes.checkpoint)  # as the checkpoint thread would
        first.start()
        assert entered.wait(10)
        second: list[bool] = []
        waiter = threading.Thread(target=lambda: second.append(rt.indexes.checkpoint()))
        waiter.start()
        waiter.join(0.3)
        assert waiter.is_alive()  # waiting for the write in flight, not returning early
        release.set()
        first.join(10)
        waiter.join(10)
        assert second == [False]  # nothing left to write: the first one wrote it
        [(position, _)] = rt.indexes.snapshots(rt.indexes.index.version)  # the stale one already gone
        assert position == rt.indexes.position
    finally:
        rt.close()


def test_a_snapshot_from_before_the_index_log_still_loads(settings: Settings, embedder: Embedder) -> None:
    """Upgrading: `ivf-<clustering>.faiss` (no position) is read as position 0 and checked, not rebuilt."""
    path = fill(settings, embedder)
    version = path.name.split("@")[0][len("ivf-") :]
    path.rename(path.with_name(f"ivf-{version}.faiss"))
    rt = reopen(settings, embedder)
    try:
        assert rt.index_status == "loaded"
        assert_consistent(rt)
    finally:
        rt.close()
