# Triton runs on CPU only in its interpreter, and the switch is read when a kernel module is
# first imported: set it before anything else can import one.
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.runtime import Runtime
from app.settings import Settings
from engine.embedder import Embedder

TOKEN = "test-admin-token"
DATABASES = ["sqlite"] + (["postgresql"] if os.environ.get("MOERAG_TEST_PG_URL") else [])


@pytest.fixture(params=DATABASES)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database URL on each kind the run has: a SQLite file, and the scratch PostgreSQL
    (emptied to base first) when MOERAG_TEST_PG_URL is set."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shared.db'}"
        return
    from app.db import make_engine
    from app.migrate import downgrade

    url = os.environ["MOERAG_TEST_PG_URL"]
    engine = make_engine(url)
    downgrade(engine, "base")
    engine.dispose()
    yield url


AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The real packaged model, loaded once for the whole run."""
    return Embedder()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", admin_token=TOKEN, checkpoint_seconds=0.2)  # type: ignore[arg-type]


@pytest.fixture
def runtime(settings: Settings, embedder: Embedder) -> Iterator[Runtime]:
    rt = Runtime(settings, embedder=embedder)
    rt.start()
    yield rt
    rt.close()


@pytest.fixture
def client(settings: Settings, embedder: Embedder) -> Iterator[TestClient]:
    rt = Runtime(settings, embedder=embedder)
    with TestClient(create_app(settings, runtime=rt, start_in_background=False)) as c:
        yield c
