import os
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from app.db import make_engine
from app.migrate import downgrade, upgrade
from app.models import Base

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
