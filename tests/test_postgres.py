"""The same catalogue on PostgreSQL (runs when MOERAG_TEST_PG_URL points at a scratch database)."""

import os
from pathlib import Path

import pytest

from app.core.db import make_engine
from app.core.migrate import downgrade
from app.core.settings import Settings
from app.runtime import Runtime
from app.services.documents import Upload
from engine.embedder import Embedder
from tests.helpers import topic_doc

PG_URL = os.environ.get("MOERAG_TEST_PG_URL")
pytestmark = pytest.mark.skipif(not PG_URL, reason="MOERAG_TEST_PG_URL not set")


def test_ingest_search_delete_and_restart_on_postgres(tmp_path: Path, embedder: Embedder) -> None:
    assert PG_URL
    engine = make_engine(PG_URL)
    downgrade(engine, "base")  # a clean schema, then the runtime migrates it up
    engine.dispose()
    settings = Settings(data_dir=tmp_path / "d", database_url=PG_URL, admin_token="t")  # type: ignore[arg-type]
    rt = Runtime(settings, embedder=embedder)
    rt.start()
    try:
        assert rt.engine.dialect.name == "postgresql"
        ids = [
            rt.ingestor.ingest(Upload(data=topic_doc(t, i).encode(), source=f"{t}.md", filename=f"{t}.md")).document_id
            for i, t in enumerate(["sqlite", "git", "debian", "python"])
        ]
        assert rt.ingestor.ingest(Upload(data=topic_doc("git", 1).encode(), source="again.md")).status == "duplicate"
        rt.indexes.recluster()
        from app.services.search import search

        hits = search(rt.sessions, rt.embedder, rt.indexes.index, "git branch rebase", 3, None).hits
        assert hits[0].chunk.document_id == ids[1]
        assert rt.ingestor.delete(ids[1]) >= 1
        stats = rt.stats()
        assert stats["documents"] == 3 and stats["chunks"] == stats["index_vectors"]
    finally:
        rt.close()
    rt = Runtime(settings, embedder=embedder)
    rt.start()
    try:
        assert rt.index_status == "loaded" and rt.stats()["chunks"] == stats["chunks"]
    finally:
        rt.close()
