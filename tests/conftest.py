# Triton runs on CPU only in its interpreter, and the switch is read when a kernel module is
# first imported: set it before anything else can import one.
import copy
import json
import os
import shutil
import tempfile

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One exported question model for the whole run (every server start reads it), not the user's cache.
os.environ.setdefault("MOERAG_CACHE_DIR", os.path.join(tempfile.gettempdir(), "moerag-test-cache"))

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.api.main import create_app
from app.core.models import Chunk, Document
from app.core.settings import Settings
from app.runtime import Runtime
from engine.embedder import Embedder
from tests.helpers import TOPICS, topic_doc, wait_job

TOKEN = "test-admin-token"


def _worker_database() -> None:
    """Under pytest-xdist each worker gets its own scratch PostgreSQL database (the run's one with
    the worker's name appended, created when missing): tests empty theirs to base as they start."""
    url, worker = os.environ.get("MOERAG_TEST_PG_URL"), os.environ.get("PYTEST_XDIST_WORKER")
    if not url or not worker:
        return
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    base = make_url(url)
    name = f"{base.database}_{worker}"
    engine = create_engine(base, isolation_level="AUTOCOMMIT")
    with engine.connect() as c:
        if not c.scalar(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}):
            c.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    os.environ["MOERAG_TEST_PG_URL"] = base.set(database=name).render_as_string(hide_password=False)


_worker_database()  # before any test module reads MOERAG_TEST_PG_URL
DATABASES = ["sqlite"] + (["postgresql"] if os.environ.get("MOERAG_TEST_PG_URL") else [])


# The fast tier (`make test-fast`: pytest -m "not slow") leaves out every test that starts a real
# server process (a `tests.server.Server`, the sample store's `serve --sample`, llama.cpp), drives
# Chromium, runs a benchmark script or compiles the question model; those carry `slow`, by hand
# or here: a test whose module imports `tests.server`, or that takes one of these fixtures.
SLOW_FIXTURES = {"sample_store", "llama_server"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = getattr(item, "module", None)
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) or hasattr(module, "Server"):
            item.add_marker(pytest.mark.slow)
    items[:] = _by_file_rank(items)


def _by_file_rank(items: list[pytest.Item]) -> list[pytest.Item]:
    """Files in the order `make test` hands them to its workers (pytest-xdist, --dist loadfile
    --no-loadscope-reorder), each file whole: first one that takes the sample store (its worker
    builds the store while the others start on theirs), then the other files with slow tests,
    then the sample store's other users, then the fast files. Within a rank, the collected order."""
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)

    def uses_sample(group: list[pytest.Item]) -> bool:
        return any("sample_store" in getattr(i, "fixturenames", ()) for i in group)

    builder = next((f for f, group in files.items() if uses_sample(group)), None)

    def rank(name: str) -> int:
        group = files[name]
        if name == builder:
            return 0
        if uses_sample(group):
            return 2
        return 1 if any(i.get_closest_marker("slow") for i in group) else 3

    return [i for name in sorted(files, key=rank) for i in files[name]]


@pytest.fixture(params=DATABASES)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database URL on each kind the run has: a SQLite file, and the scratch PostgreSQL
    (emptied to base first) when MOERAG_TEST_PG_URL is set."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shared.db'}"
        return
    from app.core.db import make_engine
    from app.core.migrate import downgrade

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


@dataclass(frozen=True)
class SampleStore:
    """The pydoc sample store as `moerag serve --sample` prepares it on an empty data dir
    (ingested, clustered, experts proposed, router trained), its server stopped."""

    data: Path
    readyz: list[str]  # the /readyz statuses seen while it prepared, in order, without repeats
    log: str  # that server's log


@pytest.fixture(scope="session")
def sample_store(tmp_path_factory: pytest.TempPathFactory) -> SampleStore:
    """Built once for the whole run (and for every pytest-xdist worker) by a real `serve --sample`;
    tests take copies (`copy_sample`) rather than building it again (two to three minutes)."""
    from filelock import FileLock

    from tests.server import serve_sample

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # this run's, never an older one's
    store, seen = shared / "sample-store", shared / "sample-store" / "readyz.json"
    with FileLock(str(shared / "sample-store.lock")):
        if not seen.exists():
            shutil.rmtree(store, ignore_errors=True)
            store.mkdir()
            seen.write_text(json.dumps(serve_sample(store / "data", TOKEN, store / "server.log")))
    return SampleStore(store / "data", json.loads(seen.read_text()), (store / "server.log").read_text())


def copy_sample(sample: SampleStore, data_dir: Path) -> Path:
    """A private copy of the sample store at `data_dir` (every path in a store is relative to it)."""
    shutil.copytree(sample.data, data_dir)
    return data_dir


READ_TOKEN = "read-token"


@pytest.fixture(scope="module")
def sample_server(tmp_path_factory: pytest.TempPathFactory, sample_store: SampleStore) -> Iterator[Any]:
    """A live `moerag serve` on a copy of the sample store with a read token (READ_TOKEN) set,
    shared by one module's tests."""
    from tests.server import Server

    base = tmp_path_factory.mktemp("sample-server")
    data = copy_sample(sample_store, base / "data")
    server = Server(data, TOKEN, base / "server.log", MOERAG_READ_TOKEN=READ_TOKEN, MOERAG_HEADER_SECONDS="2")
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", admin_token=TOKEN, checkpoint_seconds=0.2)  # type: ignore[arg-type]


@pytest.fixture
def runtime(settings: Settings, embedder: Embedder) -> Iterator[Runtime]:
    rt = Runtime(settings, embedder=embedder)
    rt.start()
    yield rt
    rt.close()


ROUTED_SETTINGS = {"clusters": 4, "router_samples": 300}


@pytest.fixture
def client(request: pytest.FixtureRequest, settings: Settings, embedder: Embedder) -> Iterator[TestClient]:
    """The app on a real runtime over a new data dir; with `routed`, a copy of the routed store."""
    if "routed" in request.fixturenames:
        store: RoutedStore = request.getfixturevalue("routed_store")
        shutil.copytree(store.data, settings.resolved_data_dir)
        for name, value in ROUTED_SETTINGS.items():
            setattr(settings, name, value)
    rt = Runtime(settings, embedder=embedder)
    with TestClient(create_app(settings, runtime=rt, start_in_background=False)) as c:
        yield c


@dataclass(frozen=True)
class RoutedStore:
    data: Path  # the store, its runtime stopped
    facts: dict[str, Any]  # {"experts": {topic: id}, "topic_of": {cluster: topic}, "job": the training job}


@pytest.fixture(scope="session")
def routed_store(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> RoutedStore:
    """4 topics ingested, 4 clusters, experts for git/sqlite/debian (python left unmapped), router
    trained, all through the API; built once a run (each worker) and copied for every test (`routed`)."""
    tmp = tmp_path_factory.mktemp("routed-store")
    settings = Settings(data_dir=tmp / "data", admin_token=TOKEN, checkpoint_seconds=0.2, **ROUTED_SETTINGS)  # type: ignore[arg-type]
    with TestClient(create_app(settings, runtime=Runtime(settings, embedder=embedder), start_in_background=False)) as c:
        facts = _build_routed(c)
    return RoutedStore(settings.resolved_data_dir, facts)


@pytest.fixture
def routed(client: TestClient, routed_store: RoutedStore) -> dict[str, Any]:
    """The routed store's facts; `client` serves a copy of that store."""
    return copy.deepcopy(routed_store.facts)


def _build_routed(client: TestClient) -> dict[str, Any]:
    rt = client.app.state.runtime  # type: ignore[attr-defined]
    files = [
        ("files", (f"{t}-{i}.md", topic_doc(t, i, paragraphs=4).encode(), "text/markdown"))
        for i in range(8)
        for t in TOPICS
    ]
    assert wait_job(client, client.post("/documents/bulk", files=files, headers=AUTH).json()["id"])["status"] == "done"
    assert wait_job(client, client.post("/admin/api/recluster", headers=AUTH).json()["id"])["status"] == "done"
    with rt.sessions() as s:
        rows = s.execute(select(Chunk.cluster_id, Document.source).join(Document)).all()
    votes: dict[int, Counter[str]] = {}
    for cluster, source in rows:
        votes.setdefault(cluster, Counter())[source.split("-")[0]] += 1
    topic_of = {c: v.most_common(1)[0][0] for c, v in votes.items()}
    experts = {}
    for topic in ("git", "sqlite", "debian"):
        r = client.post("/admin/api/experts", json={"name": topic, "system_prompt": f"You know {topic}."}, headers=AUTH)
        assert r.status_code == 201
        experts[topic] = r.json()["id"]
        owned = [c for c, t in topic_of.items() if t == topic]
        assigned = client.post(
            "/admin/api/clusters/assign", json={"cluster_ids": owned, "expert_id": experts[topic]}, headers=AUTH
        ).json()
        assert assigned["assigned"] == len(owned)
        # Remapping re-places documents so each stays inside one expert's lists.
        assert wait_job(client, assigned["realign_job"])["status"] == "done"
    leak = client.get("/admin/api/scope-leakage", headers=AUTH).json()
    assert leak["chunks_outside"] == 0 and leak["share"] == 0.0, leak
    assert all(c["outside"] == 0 for c in client.get("/admin/api/clusters", headers=AUTH).json()["items"])
    job = wait_job(client, client.post("/admin/api/router/train", headers=AUTH).json()["id"])
    assert job["status"] == "done", job
    return {"experts": experts, "topic_of": topic_of, "job": job}
