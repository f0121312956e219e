# Triton runs on CPU only in its interpreter, and the switch is read when a kernel module is
# first imported: set it before anything else can import one.
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.main import create_app
from app.models import Chunk, Document
from app.runtime import Runtime
from app.settings import Settings
from engine.embedder import Embedder
from tests.helpers import TOPICS, topic_doc, wait_job

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


@pytest.fixture
def routed(client: TestClient) -> dict[str, Any]:
    """4 topics ingested, 4 clusters, experts for git/sqlite/debian (python left unmapped), router trained."""
    rt = client.app.state.runtime  # type: ignore[attr-defined]
    rt.settings.clusters = 4
    rt.settings.router_samples = 300
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
