"""Issue 13's API: one list envelope everywhere, document search, the chunk viewer's neighbours,
consistent names with deprecated aliases, and proposals that keep the operator's mapping."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from fastapi.testclient import TestClient

from app.clustering.proposals import labels, name_groups
from tests.conftest import AUTH
from tests.helpers import TOPICS, wait_job

LISTS = [
    "/documents",
    "/jobs",
    "/admin/api/clusters",
    "/admin/api/experts",
    "/admin/api/router/versions",
    "/admin/api/questions",
]


def test_every_list_is_one_envelope_with_offset_and_limit(client: TestClient, routed: dict[str, Any]) -> None:
    client.post("/ask", json={"query": "What does a git rebase do?"})
    client.post("/ask", json={"query": "How does apt resolve dependencies?"})
    job = client.post("/admin/api/router/train", json={"activate": False}, headers=AUTH).json()
    assert wait_job(client, job["id"])["status"] == "done"  # a second router version
    for path in LISTS:
        whole = client.get(path, headers=AUTH).json()
        assert set(whole) == {"items", "total", "offset", "limit"}, path
        assert whole["total"] >= 2 and len(whole["items"]) == min(whole["total"], whole["limit"]), path
        second = client.get(f"{path}?offset=1&limit=1", headers=AUTH).json()
        assert (second["offset"], second["limit"], second["total"]) == (1, 1, whole["total"]), path
        assert second["items"] == whole["items"][1:2], path
        assert client.get(f"{path}?limit=501", headers=AUTH).status_code == 422, path
    spec = client.get("/openapi.json").json()["paths"]
    for path in LISTS:
        names = {p["name"] for p in spec[path]["get"]["parameters"]}
        assert {"offset", "limit"} <= names, path


def test_document_search_finds_title_source_and_text(client: TestClient) -> None:
    docs = {
        "apt.md": "# Package pinning\n\nPreferences decide which archive wins when versions differ.",
        "wal.md": "# Write-ahead log\n\nCheckpoints copy the log back into the database file.",
        "odd.md": "# Percent\n\nA literal 100%_done marker.",
    }
    for name, text in docs.items():
        r = client.post("/documents", json={"text": text, "source": name, "format": "md"}, headers=AUTH)
        assert r.status_code == 201

    def found(q: str) -> list[str]:
        page = client.get("/documents", params={"q": q}).json()
        assert page["total"] == len(page["items"])
        return sorted(d["source"] for d in page["items"])

    assert found("pinning") == ["apt.md"]  # title
    assert found("WAL.MD") == ["wal.md"]  # source, any case
    assert found("checkpoints copy") == ["wal.md"]  # text of a chunk
    assert found("100%_") == ["odd.md"] and found("%") == ["odd.md"]  # % and _ are plain characters
    assert found("nothing like this") == []
    assert client.get("/documents", params={"q": "x" * 201}).status_code == 422


def test_chunk_viewer_gets_place_expert_and_neighbours(client: TestClient, routed: dict[str, Any]) -> None:
    text = "# Git notes\n\n" + "\n\n".join(f"## Part {i}\n\n{TOPICS['git']} (part {i})" for i in range(3))
    doc = client.post("/documents", json={"text": text, "source": "parts.md", "format": "md"}, headers=AUTH).json()
    chunks = client.get(f"/documents/{doc['id']}").json()["chunk_list"]
    assert len(chunks) == 3  # a chunk never crosses a section
    first = client.get(f"/chunks/{chunks[0]['id']}").json()
    assert first["previous"] is None and first["next"]["id"] == chunks[1]["id"] and first["next"]["text"]
    assert first["heading"] == "Git notes > Part 0"
    cluster = client.get(f"/admin/api/clusters/{first['cluster_id']}", headers=AUTH).json()
    assert first["expert_id"] == cluster["expert_id"]
    middle = client.get(f"/chunks/{chunks[1]['id']}").json()
    assert (middle["previous"]["id"], middle["next"]["id"]) == (chunks[0]["id"], chunks[2]["id"])
    last = client.get(f"/chunks/{chunks[-1]['id']}").json()
    assert last["next"] is None and last["previous"]["id"] == chunks[-2]["id"]


def test_query_and_k_on_ask_with_the_old_names_deprecated(client: TestClient, routed: dict[str, Any]) -> None:
    question = "How does a git rebase replay commits onto another branch?"
    new = client.post("/ask", json={"query": question, "k": 3, "generate": False})
    old = client.post("/ask", json={"question": question, "top_k": 3, "generate": False})
    assert new.status_code == old.status_code == 200
    assert "deprecation" not in new.headers
    assert old.headers["deprecation"] == "true" and old.headers["x-deprecated-fields"] == "question, top_k"
    ids = [[c["chunk_id"] for c in r.json()["citations"]] for r in (new, old)]
    assert ids[0] == ids[1] and len(ids[0]) == 3
    both = client.post("/ask", json={"query": question, "question": question})
    assert both.status_code == 422 and "'question' is its deprecated name" in both.text
    assert client.post("/admin/api/router/try", json={"query": question}, headers=AUTH).status_code == 200
    schema = client.get("/openapi.json").json()["components"]["schemas"]["AskIn"]["properties"]
    assert schema["question"]["deprecated"] is True and schema["top_k"]["deprecated"] is True


def test_proposal_keeps_manual_mappings_and_shows_the_diff(client: TestClient, routed: dict[str, Any]) -> None:
    experts = routed["experts"]
    python = sorted(c for c, t in routed["topic_of"].items() if t == "python")
    kept = client.post("/admin/api/experts/propose", json={"n": 1}, headers=AUTH).json()
    assert [p["cluster_ids"] for p in kept["proposals"]] == [python]  # only the unmapped clusters
    assert kept["diff"]["moved"] == [] and kept["diff"]["emptied_experts"] == []
    assert kept["diff"]["kept_clusters"] == len(routed["topic_of"]) - len(python)
    assert "python" in kept["proposals"][0]["name"]  # named from its documents' titles

    # The operator's experts are owned: "keep" unticked regroups nothing of theirs.
    owned = client.post("/admin/api/experts/propose", json={"n": 2, "keep_mapped": False}, headers=AUTH).json()
    assert owned["diff"]["moved"] == [] and owned["diff"]["emptied_experts"] == []
    assert {e["name"] for e in owned["diff"]["owned_kept"]} >= {"debian", "git", "sqlite"}
    # Released to automation (owned: false), their clusters are regrouped, and the diff says so.
    for t in ("git", "sqlite", "debian"):
        released = client.patch(f"/admin/api/experts/{experts[t]}", json={"owned": False}, headers=AUTH)
        assert released.status_code == 200 and released.json()["owned"] is False
    regroup = client.post("/admin/api/experts/propose", json={"n": 2, "keep_mapped": False}, headers=AUTH).json()
    moved = {m["cluster_id"]: m["from_expert_id"] for m in regroup["diff"]["moved"]}
    mapped = {c: experts[t] for c, t in routed["topic_of"].items() if t != "python"}
    assert moved == mapped
    assert sorted(e["name"] for e in regroup["diff"]["emptied_experts"]) == ["debian", "git", "sqlite"]
    for t in ("git", "sqlite", "debian"):  # the team's again
        assert client.patch(f"/admin/api/experts/{experts[t]}", json={"owned": True}, headers=AUTH).json()["owned"]

    wrong = client.post("/admin/api/experts/propose", json={"n": 1, "apply": True, "names": ["a", "b"]}, headers=AUTH)
    assert wrong.status_code == 409
    applied = client.post(
        "/admin/api/experts/propose", json={"n": 1, "apply": True, "names": ["Python notes"]}, headers=AUTH
    ).json()
    assert applied["applied"] and applied["proposals"][0]["name"] == "Python notes"
    listed = {e["name"]: e["clusters"] for e in client.get("/admin/api/experts", headers=AUTH).json()["items"]}
    assert listed["Python notes"] == python
    assert all(listed[t] for t in ("git", "sqlite", "debian"))  # the operator's experts kept their clusters


def test_names_come_from_distinctive_title_and_heading_labels() -> None:
    assert labels("json — JSON encoder and decoder — Python 3.11.2 documentation", "json > Basic Usage") == {
        "json",
        "JSON encoder and decoder",
        "Python 3.11.2 documentation",
    }
    assert labels("PostgreSQL 15 Manual", "8.5. Date/Time Types > 8.5.1. Input") == {
        "PostgreSQL 15 Manual",
        "Date/Time Types",
    }
    # "Python docs" is everywhere: it names nothing; each group's own module does.
    groups = [
        {"Python docs": 10, "json": 6, "csv": 4},
        {"Python docs": 10, "sqlite3": 9, "json": 1},
    ]
    counters = [Counter(g) for g in groups]
    titles = [Counter({"json — Python docs": 6}), Counter({"sqlite3 — Python docs": 9})]
    assert name_groups(counters, [10, 10], titles) == ["json · csv", "sqlite3"]
    # Nothing distinctive: the most common titles.
    flat = [Counter({"Python docs": 10}), Counter({"Python docs": 10})]
    assert name_groups(flat, [10, 10], [Counter({"a": 6, "b": 4}), Counter({"c": 1})]) == ["a · b", "c"]


def test_the_spec_declares_bearer_auth_and_the_real_error_shape(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert "HTTPValidationError" not in spec["components"]["schemas"]  # FastAPI's {"detail"} shape
    ask = spec["paths"]["/ask"]["post"]
    assert ask["responses"]["4XX"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorOut")
    assert spec["paths"]["/documents"]["post"]["security"] == [{"HTTPBearer": []}]  # writes: the admin token
    for path, method in (("/ask", "post"), ("/search", "post"), ("/documents", "get"), ("/jobs", "get")):
        assert spec["paths"][path][method]["security"] == [{}, {"ReadToken": []}], path  # reads: optional


def test_method_not_allowed_names_every_method_of_the_path(client: TestClient) -> None:
    r = client.request("OPTIONS", "/admin/api/experts/1", headers=AUTH)
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    assert r.headers["allow"] == "DELETE, PATCH"  # two routes share the path: both named
    r = client.request("OPTIONS", "/documents/bulk", headers=AUTH)
    assert r.status_code == 405 and r.headers["allow"] == "POST"  # a literal path is its own resource


def test_mapping_a_cluster_while_a_recluster_replaces_them_is_never_a_server_error(client: TestClient) -> None:
    """PUT /admin/api/clusters/{id} checks and changes in one locked transaction: a recluster that
    commits in between makes it a 404 (the list is gone) or a 200 that reads back its own mapping."""
    rt = client.app.state.runtime  # type: ignore[attr-defined]
    files = [("files", (f"{t}.md", f"# {t}\n\n{TOPICS[t]}".encode() * 3, "text/markdown")) for t in TOPICS]
    assert wait_job(client, client.post("/documents/bulk", files=files, headers=AUTH).json()["id"])["status"] == "done"
    expert = client.post("/admin/api/experts", json={"name": "racing"}, headers=AUTH).json()["id"]
    done = threading.Event()

    def recluster() -> None:
        try:
            for k in (1, 4) * 15:
                rt.indexes.recluster(clusters=k)
        finally:
            done.set()

    worker = threading.Thread(target=recluster)
    worker.start()
    codes: Counter[int] = Counter()
    while not done.is_set():
        r = client.put("/admin/api/clusters/3", json={"expert_id": expert}, headers=AUTH)
        codes[r.status_code] += 1
        assert r.status_code in (200, 404), r.text
        if r.status_code == 200:
            assert r.json()["expert_id"] == expert
    worker.join()
    assert codes[200] + codes[404] > 0


def test_a_recluster_into_fewer_lists_keeps_every_owned_expert_and_its_documents(
    client: TestClient, routed: dict[str, Any]
) -> None:
    from sqlalchemy import select

    from app.core.models import Chunk, Cluster, Document

    rt = client.app.state.runtime  # type: ignore[attr-defined]
    job = client.post("/admin/api/recluster", json={"clusters": 2}, headers=AUTH).json()
    assert wait_job(client, job["id"])["status"] == "done"
    with rt.sessions() as s:
        rows = s.execute(
            select(Document.source, Cluster.expert_id)
            .join(Chunk, Chunk.document_id == Document.id)
            .join(Cluster, Cluster.id == Chunk.cluster_id)
        ).all()
    for topic, expert in routed["experts"].items():  # outvoted in two lists, each still holds its own
        held = {e for src, e in rows if src.startswith(f"{topic}-")}
        assert held == {expert}, (topic, held)
    history = client.get("/admin/api/experts/history", headers=AUTH).json()["items"]
    assert history[0]["action"] == "recluster" and history[0]["lists_replaced"]
