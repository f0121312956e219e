"""`moerag db copy-to URL`: a SQLite store moves to PostgreSQL whole, and serves the same answers there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.core.db import make_engine
from app.core.migrate import downgrade
from app.core.settings import Settings
from app.runtime import Runtime
from app.services import experts as expert_service
from app.services.dbcopy import TargetNotEmpty, copy_database
from app.services.documents import Upload
from engine.embedder import Embedder
from tests.helpers import TOPICS, topic_doc

PG_URL = os.environ.get("MOERAG_TEST_PG_URL")
pytestmark = pytest.mark.skipif(not PG_URL, reason="MOERAG_TEST_PG_URL not set")


@pytest.mark.slow  # builds and serves two stores
def test_copy_a_sqlite_store_to_postgresql_and_serve_from_it(tmp_path: Path, embedder: Embedder) -> None:
    assert PG_URL
    engine = make_engine(PG_URL)
    downgrade(engine, "base")
    source = Runtime(Settings(data_dir=tmp_path / "lite", clusters=4, router_samples=300), embedder=embedder)  # type: ignore[arg-type]
    source.start(run_jobs=False)
    for i in range(2):
        for t in TOPICS:
            source.ingestor.ingest(Upload(data=topic_doc(t, i, 4).encode(), source=f"{t}-{i}.md"))
    source.indexes.recluster()
    git = expert_service.create(source.sessions, {"name": "git"}).id
    git_list = int(source.indexes.index.assign(embedder.encode([TOPICS["git"]]))[0])
    expert_service.assign(source.sessions, [git_list], git)
    rest = expert_service.create(source.sessions, {"name": "the rest"}).id  # a gate needs two experts
    expert_service.assign(source.sessions, sorted(set(range(4)) - {git_list}), rest)
    version = source.routers.train(activate=True, force=True)["version"]
    question = embedder.encode(["how does a rebase replay commits"])
    before = source.indexes.index.search(question, 5)
    stats = source.stats()
    counts = copy_database(source.engine, engine)
    assert counts["chunk"] == stats["chunks"] and counts["document"] == stats["documents"]
    with pytest.raises(TargetNotEmpty):
        copy_database(source.engine, engine)
    source.close()

    target = Runtime(Settings(data_dir=tmp_path / "pg", database_url=PG_URL), embedder=embedder)  # type: ignore[arg-type]
    target.start(run_jobs=False)
    try:
        assert target.stats() == stats
        after = target.indexes.index.search(question, 5)
        assert after[1].tolist() == before[1].tolist()  # same ids, same order
        router = target.state().router
        assert router is not None and router.version_id == version
        assert target.state().experts[git].name == "git"
        new = target.ingestor.ingest(Upload(data=topic_doc("sqlite", 9, 4).encode(), source="new.md"))
        assert new.status == "created" and new.document_id > counts["document"]  # ids go on
    finally:
        target.close()
        engine.dispose()
