import os
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from app.core.db import make_engine
from app.core.migrate import downgrade, upgrade
from app.core.models import Base

URLS = ["sqlite"] + (["postgresql"] if os.environ.get("MOERAG_TEST_PG_URL") else [])


@pytest.fixture(params=URLS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'm.db'}"
    return os.environ["MOERAG_TEST_PG_URL"]


def test_upgrade_downgrade_upgrade_and_no_drift(db_url: str) -> None:
    engine = make_engine(db_url)
    upgrade(engine)
    assert {"document", "chunk", "cluster", "expert", "job", "index_state"} <= set(inspect(engine).get_table_names())
    downgrade(engine, "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    upgrade(engine)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == [], f"models and migrations drifted: {diff}"
    if engine.dialect.name == "sqlite":
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    downgrade(engine, "base")
    engine.dispose()


def test_ids_are_never_reused_and_the_rebuild_keeps_every_row(db_url: str) -> None:
    """0005 -> 0006 keeps rows, ids and children (dropping the old `document` must not cascade to
    `chunk`); afterwards deleting the newest row does not hand its id out again."""
    engine = make_engine(db_url)
    downgrade(engine, "base")
    upgrade(engine, "0005")
    doc = (
        "INSERT INTO document (source, title, mime, content_hash, size, status, metadata, created_at, updated_at) "
        "VALUES ('s', 't', 'text/plain', '{h}', 1, 'ready', '{{}}', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP) RETURNING id"
    )
    chunk = (
        "INSERT INTO chunk (document_id, ordinal, text, heading, char_start, char_end, token_count, cluster_id, "
        "embedding) VALUES ({id}, 0, 'x', '', 0, 1, 1, 0, '')"
    )
    with engine.begin() as conn:
        ids = [conn.exec_driver_sql(doc.format(h=h)).scalar_one() for h in ("a", "b")]
        for i in ids:
            conn.exec_driver_sql(chunk.format(id=i))
    upgrade(engine)
    with engine.begin() as conn:
        assert conn.exec_driver_sql("SELECT id FROM document ORDER BY id").scalars().all() == ids
        assert conn.exec_driver_sql("SELECT document_id FROM chunk ORDER BY id").scalars().all() == ids
        conn.exec_driver_sql(f"DELETE FROM document WHERE id = {ids[1]}")
        assert conn.exec_driver_sql("SELECT count(*) FROM chunk").scalar() == 1  # the cascade still works
        assert conn.exec_driver_sql(doc.format(h="c")).scalar_one() > ids[1]
    if engine.dialect.name == "sqlite":
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    downgrade(engine, "base")
    engine.dispose()
