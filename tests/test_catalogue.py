"""One catalogue version: bumped in the writer's transaction, followed by every process.

Two `Catalogue`s on one database stand for two processes (each with its own engine and
sessions); the same tests run on SQLite and, when MOERAG_TEST_PG_URL is set, on PostgreSQL,
where a NOTIFY wakes the follower.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from app.core.db import make_engine, make_sessionmaker
from app.core.migrate import upgrade
from app.core.models import CatalogueChange, Cluster, Expert, Job
from app.store.catalogue import Catalogue, read_version


def process(url: str, poll: float = 0.05) -> tuple[sessionmaker[Session], Catalogue]:
    engine = make_engine(url)
    upgrade(engine)
    sessions = make_sessionmaker(engine)
    return sessions, Catalogue(sessions, poll)


def wait_for(check: object, seconds: float = 5.0) -> float:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if check():  # type: ignore[operator]
            return time.monotonic() - start
        time.sleep(0.005)
    raise AssertionError("not seen in time")


def test_writes_bump_the_version_in_their_transaction_and_others_do_not(db_url: str) -> None:
    sessions, cat = process(db_url)
    cat.open()
    with sessions.begin() as s:
        s.add(Expert(name="git"))
    with sessions.begin() as s:
        s.add(Job(kind="ingest"))  # not part of the catalogue
    with sessions() as s:
        assert read_version(s) == 1
        assert s.scalars(select(CatalogueChange.parts)).all() == [["experts"]]
    with pytest.raises(RuntimeError), sessions.begin() as s:
        s.add(Expert(name="sqlite"))
        raise RuntimeError("rolled back")
    with sessions.begin() as s:  # a Core-style bulk statement through the session counts too
        s.add(Cluster(id=0, centroid=np.zeros(4, dtype=np.float32), keywords=[]))
        s.flush()
        s.execute(update(Cluster).values(keywords=["x"]))
    with sessions() as s:
        assert read_version(s) == 2
        assert s.scalars(select(CatalogueChange.parts).order_by(CatalogueChange.version)).all()[-1] == ["clusters"]
        assert s.scalar(select(Cluster.centroid)).tolist() == [0.0] * 4  # the Vector column reads arrays
    cat.close()
    sessions.kw["bind"].dispose()


def test_a_commit_in_this_process_is_applied_before_commit_returns(db_url: str) -> None:
    sessions, cat = process(db_url, poll=60)  # the follower would take a minute: only the commit hook can do it
    seen: list[tuple[int, frozenset[str]]] = []
    cat.subscribe(["experts"], lambda v, parts: seen.append((v, parts)))
    cat.open()
    cat.follow()
    with sessions.begin() as s:
        s.add(Expert(name="git"))
    assert seen == [(1, frozenset({"experts"}))] and cat.version == 1
    with sessions.begin() as s:
        s.add(Cluster(id=0, centroid=np.zeros(4, dtype=np.float32), keywords=[]))
    assert len(seen) == 1 and cat.version == 2  # applied, but no subscriber of clusters to call
    cat.close()
    sessions.kw["bind"].dispose()


def test_another_process_follows_within_a_bound(db_url: str) -> None:
    writer_sessions, writer = process(db_url)
    reader_sessions, reader = process(db_url)
    names: list[list[str]] = []

    def reload(version: int, parts: frozenset[str]) -> None:
        with reader_sessions() as s:
            names.append(sorted(s.scalars(select(Expert.name))))

    reader.subscribe(["experts"], reload)
    writer.open()
    reader.open()
    reader.follow()
    lags = []
    for i in range(5):
        with writer_sessions.begin() as s:
            s.add(Expert(name=f"e{i}"))
        lags.append(wait_for(lambda i=i: names and f"e{i}" in names[-1]))
    wait_for(lambda: reader.version == 5)  # set after its subscribers ran
    # SQLite polls every 0.05 s here; PostgreSQL is woken by NOTIFY.
    assert max(lags) < 1.0, lags
    reader.close()
    writer.close()
    for s in (writer_sessions, reader_sessions):
        s.kw["bind"].dispose()


def test_concurrent_writers_get_distinct_versions_in_commit_order(db_url: str) -> None:
    sessions, cat = process(db_url)
    cat.open()

    def write(i: int) -> None:
        for j in range(5):
            with sessions.begin() as s:
                s.add(Expert(name=f"w{i}-{j}"))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with sessions() as s:
        versions = s.scalars(select(CatalogueChange.version).order_by(CatalogueChange.version)).all()
        assert versions == list(range(1, 21)) and read_version(s) == 20
    assert cat.version == 20  # each commit synced this process
    sessions.kw["bind"].dispose()
