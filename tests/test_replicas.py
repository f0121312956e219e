"""Several processes on one catalogue: each holds a replica of the index that follows the index log.

Each runtime here has its own data directory (its own snapshots and lock) and shares one
database, as separate processes or machines would: on PostgreSQL when MOERAG_TEST_PG_URL is
set, and on one SQLite file otherwise (the log works there too; several *serving workers*
still need PostgreSQL).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select

from app.core.models import Chunk
from app.core.settings import Settings
from app.runtime import Runtime
from app.services import experts as expert_service
from app.services.documents import Upload
from engine.embedder import Embedder
from tests.helpers import TOPICS, topic_doc


@pytest.fixture
def start(db_url: str, tmp_path: Path, embedder: Embedder) -> Iterator[Callable[[str], Runtime]]:
    started: list[Runtime] = []

    def make(name: str) -> Runtime:
        settings = Settings(
            data_dir=tmp_path / name,
            database_url=db_url,
            admin_token="t",
            catalogue_poll_seconds=0.05,
            checkpoint_seconds=0.2,
            clusters=4,
            router_samples=300,
        )  # type: ignore[arg-type]
        rt = Runtime(settings, embedder=embedder)
        rt.start(run_jobs=False)
        started.append(rt)
        return rt

    yield make
    for rt in started:
        rt.close()


def sql_chunks(rt: Runtime) -> int:
    with rt.sessions() as s:
        return s.scalar(select(func.count(Chunk.id))) or 0


def converged(rt: Runtime, other: Runtime) -> bool:
    """The replica holds exactly SQL's chunks, in the same lists as the other's."""
    a_ids, a_lists = rt.indexes.index.assignments()
    b_ids, b_lists = other.indexes.index.assignments()
    return (
        len(a_ids) == sql_chunks(rt)
        and np.array_equal(a_ids, b_ids)
        and np.array_equal(a_lists, b_lists)
        and rt.indexes.index.version == other.indexes.index.version
    )


def wait_until(check: Callable[[], bool], seconds: float = 10.0) -> float:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if check():
            return time.monotonic() - start
        time.sleep(0.01)
    raise AssertionError("replicas did not converge in time")


def search_ids(rt: Runtime, question: str) -> tuple[list[int], list[float]]:
    scores, ids = rt.indexes.index.search(rt.embedder.encode([question]), 5)
    return ids[0].tolist(), [round(float(s), 5) for s in scores[0]]


def test_a_second_process_follows_ingest_delete_recluster_and_router(start: Callable[[str], Runtime]) -> None:
    a, b = start("a"), start("b")
    ids = [
        a.ingestor.ingest(Upload(data=topic_doc(t, i, 4).encode(), source=f"{t}-{i}.md")).document_id
        for i in range(3)
        for t in TOPICS
    ]
    lag = wait_until(lambda: converged(b, a))
    assert lag < 2.0 and b.stats()["index_vectors"] == sql_chunks(b) > 0
    assert search_ids(b, "git rebase onto another branch") == search_ids(a, "git rebase onto another branch")

    gone = ids[0]
    with a.sessions() as s:
        gone_chunks = set(s.scalars(select(Chunk.id).where(Chunk.document_id == gone)))
    a.ingestor.delete(gone)
    wait_until(lambda: converged(b, a))
    assert not gone_chunks & set(b.indexes.index.assignments()[0].tolist())  # gone everywhere

    a.indexes.recluster()  # a new clustering: b rebuilds its replica from SQL
    wait_until(lambda: converged(b, a) and b.indexes.index.nlist == 4)

    git = expert_service.create(a.sessions, {"name": "git"}).id
    git_lists = sorted({int(c) for c in a.indexes.index.assign(a.embedder.encode([TOPICS["git"]]))})
    expert_service.assign(a.sessions, git_lists, git)
    wait_until(lambda: git in b.state().experts and b.state().experts[git].clusters == tuple(git_lists))
    rest = expert_service.create(a.sessions, {"name": "the rest"}).id  # a gate needs two experts
    expert_service.assign(a.sessions, sorted(set(range(4)) - set(git_lists)), rest)
    a.indexes.realign()
    wait_until(lambda: converged(b, a))
    result = a.routers.train(activate=True, force=True)
    wait_until(lambda: (r := b.state().router) is not None and r.version_id == result["version"])
    wait_until(lambda: b.catalogue.version == a.catalogue.version)  # a may have committed once more since


def test_a_process_started_late_boots_and_answers_like_the_others(start: Callable[[str], Runtime]) -> None:
    a = start("a")
    for i in range(2):
        for t in TOPICS:
            a.ingestor.ingest(Upload(data=topic_doc(t, i, 4).encode(), source=f"{t}-{i}.md"))
    a.indexes.recluster()
    a.ingestor.ingest(Upload(data=topic_doc("sqlite", 9, 4).encode(), source="late.md"))  # in the log only
    a.indexes.checkpoint()
    b = start("b")  # no snapshot of its own: built from SQL
    assert b.index_status.startswith("rebuilt")  # a data dir of its own: no snapshot there
    assert converged(b, a)
    for q in ("write-ahead log checkpoint", "apt resolves dependencies", "tuples are immutable"):
        assert search_ids(b, q) == search_ids(a, q)  # same ids and scores
    # A restart of a boots from its snapshot and replays what it missed.
    a.close()
    b.ingestor.ingest(Upload(data=topic_doc("git", 9, 4).encode(), source="while-a-was-down.md"))
    a2 = start("a")
    assert a2.index_status == "loaded" and converged(a2, b)


def test_a_writer_placing_in_an_old_clustering_follows_and_places_again(
    start: Callable[[str], Runtime],
) -> None:
    """b has not yet seen a's recluster (its follower is paused) when it ingests: the commit finds the
    clustering moved under the writers' lock, rolls back, follows, places again; nothing misplaced."""
    a, b = start("a"), start("b")
    for t in TOPICS:
        a.ingestor.ingest(Upload(data=topic_doc(t, 1, 4).encode(), source=f"{t}.md"))
    wait_until(lambda: converged(b, a))
    b.catalogue.close()  # b stops following on its own
    old = b.indexes.index.version
    a.indexes.recluster()
    assert b.indexes.index.version == old  # b is behind
    followed: list[int] = []  # the ingestor follows only after IndexMoved: count it
    b.ingestor.follow = lambda: followed.append(b.catalogue.sync())
    outcome = b.ingestor.ingest(Upload(data=topic_doc("git", 7, 4).encode(), source="late-git.md"))
    assert outcome.status == "created" and b.indexes.index.version == a.indexes.index.version
    assert len(followed) == 1  # rolled back once, followed, placed again
    a.catalogue.sync()
    assert converged(a, b) and converged(b, a)
    with a.sessions() as s:  # the late chunks sit in lists of the live clustering, nearest to them
        late = s.scalars(select(Chunk).where(Chunk.document_id == outcome.document_id)).all()
        assert all(0 <= c.cluster_id < a.indexes.index.nlist for c in late)


def test_the_log_is_compacted_under_a_snapshot_and_whoever_is_behind_it_starts_from_sql(
    start: Callable[[str], Runtime],
) -> None:
    from app.core.models import CatalogueChange, IndexLog

    a, b, c = start("a"), start("b"), start("c")
    for t in TOPICS:
        a.ingestor.ingest(Upload(data=topic_doc(t, 1, 4).encode(), source=f"{t}.md"))
    wait_until(lambda: converged(b, a) and converged(c, a))
    b.catalogue.close()  # b and c stop following: they fall behind what comes next
    c.catalogue.close()
    for i in range(3):
        a.ingestor.ingest(Upload(data=topic_doc("git", 10 + i, 4).encode(), source=f"more-{i}.md"))
    a.indexes.checkpoint()  # (or the checkpoint thread did): a snapshot at a's position
    wait_until(lambda: a.indexes.snapshots(a.indexes.index.version)[-1][0] == a.indexes.position)
    horizon = a.indexes.compact_log(retention_seconds=0)
    assert horizon == a.indexes.position == a.catalogue.version
    with a.sessions() as s:
        assert s.scalar(select(func.count()).select_from(IndexLog)) == 0
        assert s.scalar(select(func.count()).select_from(CatalogueChange)) == 0
    assert a.indexes.compact_log(retention_seconds=3600) == horizon  # nothing older: unchanged

    c.catalogue.sync()  # behind the horizon: every part counts as changed, the replica comes from SQL
    assert converged(c, a) and c.catalogue.version == a.catalogue.version
    b.close()  # its last snapshot is older than the horizon: not replayed on the next start
    b2 = start("b")
    assert b2.index_status.startswith("rebuilt") and converged(b2, a)
    a.ingestor.ingest(Upload(data=topic_doc("sqlite", 20, 4).encode(), source="after.md"))
    wait_until(lambda: converged(b2, a))  # and the log goes on from the horizon


def test_snapshots_at_a_url_are_shared_by_processes_on_other_machines(
    db_url: str, tmp_path: Path, embedder: Embedder
) -> None:
    """MOERAG_SNAPSHOT_URL (any fsspec URL; a file:// folder of its own here, as a mounted bucket
    would be): a process with an empty data directory boots from the writer's snapshot there."""
    shared = (tmp_path / "bucket").as_uri()

    def settings(name: str) -> Settings:
        return Settings(
            data_dir=tmp_path / name,
            database_url=db_url,
            admin_token="t",
            snapshot_url=shared,
            catalogue_poll_seconds=0.05,
            checkpoint_seconds=0.2,
            clusters=4,
            router_samples=300,
        )  # type: ignore[arg-type]

    a = Runtime(settings("a"), embedder=embedder)
    a.start(run_jobs=False)
    b = None
    try:
        for t in TOPICS:
            a.ingestor.ingest(Upload(data=topic_doc(t, 1, 4).encode(), source=f"{t}.md"))
        a.indexes.checkpoint()
        names = sorted(p.name for p in (tmp_path / "bucket").iterdir())
        assert names == [f"ivf-{a.indexes.index.version}@{a.indexes.position}.faiss"]  # stale ones removed
        assert not list((tmp_path / "a" / "index").glob("*.faiss"))  # nothing in the data directory
        a.ingestor.ingest(Upload(data=topic_doc("git", 2, 4).encode(), source="late.md"))  # the log only
        b = Runtime(settings("b"), embedder=embedder)  # another machine: an empty data directory
        b.start(run_jobs=False)
        assert b.index_status == "loaded" and converged(b, a)  # the snapshot, then the log after it
        assert search_ids(b, "write-ahead log checkpoint") == search_ids(a, "write-ahead log checkpoint")
    finally:
        for rt in (b, a):
            if rt is not None:
                rt.close()


def test_an_unusable_snapshot_url_is_a_clear_error(tmp_path: Path) -> None:
    from app.store.snapshots import SnapshotStore

    with pytest.raises(RuntimeError, match="MOERAG_SNAPSHOT_URL='nosuchproto://x' cannot be opened"):
        SnapshotStore(tmp_path, "nosuchproto://x")


def test_a_snapshot_replaced_while_it_is_being_read_is_listed_again(
    settings: Settings, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process lists the newest snapshot and, before it reads it, another process's writer puts a
    newer one in place and removes it (seen on PostgreSQL in the suite: the start rebuilt from SQL,
    "cannot read …@5.faiss"). The reader lists again and loads the newer one."""
    from app.store.snapshots import SnapshotStore, position_of, snapshot_name

    a = Runtime(settings, embedder=embedder)
    a.start(run_jobs=False)
    for t in TOPICS:
        a.ingestor.ingest(Upload(data=topic_doc(t, 1, 4).encode(), source=f"{t}.md"))
    a.indexes.checkpoint()
    version = a.indexes.index.version
    a.close()
    original, swaps = SnapshotStore.read, []

    def replaced_first(self: SnapshotStore, location: str) -> bytes:
        if not swaps:  # the writer: a newer snapshot in place, this one removed
            old = Path(location)
            position = position_of(old.name, version)
            assert position is not None
            newer = old.with_name(snapshot_name(version, position + 1))
            newer.write_bytes(old.read_bytes())
            old.unlink()
            swaps.append(newer.name)
        return original(self, location)

    monkeypatch.setattr(SnapshotStore, "read", replaced_first)
    b = Runtime(settings, embedder=embedder)
    b.start(run_jobs=False)
    try:
        assert swaps and b.index_status == "loaded", b.index_status
    finally:
        b.close()
