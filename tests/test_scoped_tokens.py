"""Scoped tokens: who may read what, enforced inside the searches, on every read surface.

The leak battery: two scopes A (git) and B (sqlite) over the same store, by tag, by source prefix
and by expert. A token scoped to A never receives a chunk id, text, title, source or expert name
of B, on any surface (JSON and streamed answers, cached answers asked first as B, search,
documents, chunks, the OpenAI models and chat, jobs, error bodies), and still gets k results where A
holds them; `/metrics`, the whole server's, refuses a scoped token. Then revocation, expiry and
write tokens (one document, bulk uploads and their jobs)."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.core.models import Chunk, Document
from tests.conftest import AUTH
from tests.helpers import topic_doc, wait_job

SQLITE_Q = "How does SQLite checkpoint the write-ahead log?"
GIT_Q = "How do I rebase a branch onto another in git?"


def _tag(rt: Any) -> None:
    """git documents tagged team-a, sqlite ones team-b (the tag scopes read `metadata.tags`)."""
    with rt.sessions.begin() as s:
        for doc in s.scalars(select(Document)):
            topic = doc.source.split("-")[0]
            doc.meta = {
                **(doc.meta or {}),
                "tags": ["team-a" if topic == "git" else "team-b" if topic == "sqlite" else "other"],
            }


def _token(client: TestClient, name: str, scope: dict[str, Any] | None, **extra: Any) -> dict[str, str]:
    r = client.post("/admin/api/tokens", json={"name": name, "scope": scope, **extra}, headers=AUTH)
    assert r.status_code == 201, r.text
    assert "secret" in r.json() and r.json()["secret"] not in json.dumps(
        client.get("/admin/api/tokens", headers=AUTH).json()
    )
    return {"Authorization": f"Bearer {r.json()['secret']}"}


class Secrets:
    """What of B a token scoped to A must never see."""

    def __init__(self, rt: Any, topic: str, expert_name: str) -> None:
        with rt.sessions() as s:
            docs = s.execute(
                select(Document.id, Document.source, Document.title).where(Document.source.startswith(topic + "-"))
            ).all()
            chunks = s.execute(
                select(Chunk.id, Chunk.text).join(Document).where(Document.source.startswith(topic + "-"))
            ).all()
        self.doc_ids = {d for d, _, _ in docs}
        self.words = {src for _, src, _ in docs} | {title for _, _, title in docs} | {expert_name}
        self.chunk_ids = {c for c, _ in chunks}
        self.texts = [t[:60] for _, t in chunks]

    def absent_from(self, body: Any, where: str) -> None:
        text = body if isinstance(body, str) else json.dumps(body)
        for word in self.words:
            assert word not in text, f"{where}: {word!r} leaked"
        for snippet in self.texts:
            assert snippet not in text, f"{where}: a chunk's text leaked"
        for found in _chunk_ids(body if not isinstance(body, str) else {}):
            assert found not in self.chunk_ids, f"{where}: chunk {found} leaked"


def _chunk_ids(body: Any) -> list[int]:
    """Every chunk id in a response body (citations, hits, chunk lists)."""
    out: list[int] = []
    if isinstance(body, dict):
        for key, value in body.items():
            if key in ("chunk_id",) and isinstance(value, int):
                out.append(value)
            out += _chunk_ids(value)
    elif isinstance(body, list):
        for item in body:
            out += _chunk_ids(item)
    return out


def _mcp(client: TestClient, headers: dict[str, str], method: str, params: dict[str, Any], error: bool = False) -> Any:
    """One JSON-RPC call to /mcp as `headers`' token: its result (or, `error`, its error)."""
    r = client.post(
        "/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
        headers=headers | {"Accept": "application/json, text/event-stream"},
    )
    assert r.status_code == 200, r.text
    data = json.loads(next(line[5:] for line in r.text.splitlines() if line.startswith("data:")))
    assert ("error" in data) == error, data
    return data["error"] if error else data["result"]


def _lists_of(rt: Any, chunks: set[int]) -> set[int]:
    with rt.sessions() as s:
        return set(s.scalars(select(Chunk.cluster_id).where(Chunk.id.in_(chunks)).distinct()))


def _without_question(body: dict[str, Any]) -> dict[str, Any]:
    """An /ask body minus the echo of the question asked (its words are the caller's own)."""
    return {k: v for k, v in body.items() if k not in ("answer", "standalone_question")}


@pytest.mark.parametrize("kind", ["tag", "prefix", "expert"])
def test_a_token_scoped_to_a_never_reads_b_on_any_surface(
    client: TestClient, routed: dict[str, Any], kind: str
) -> None:
    rt = client.app.state.runtime  # type: ignore[attr-defined]
    _tag(rt)
    experts = routed["experts"]
    scope_of = {
        "tag": ({"tags": ["team-a"]}, {"tags": ["team-b"]}),
        "prefix": ({"source_prefixes": ["git-"]}, {"source_prefixes": ["sqlite-"]}),
        "expert": ({"experts": [experts["git"]]}, {"experts": [experts["sqlite"]]}),
    }[kind]
    a = _token(client, f"a-{kind}", scope_of[0])
    b = _token(client, f"b-{kind}", scope_of[1])
    secret = Secrets(rt, "sqlite", "sqlite")
    with rt.sessions() as s:
        a_chunks = set(s.scalars(select(Chunk.id).join(Document).where(Document.source.startswith("git-"))))
        a_docs = set(s.scalars(select(Document.id).where(Document.source.startswith("git-"))))
        b_chunk = min(secret.chunk_ids)
        b_doc = min(secret.doc_ids)

    # Anonymous reads end with the first scoped token.
    assert client.post("/ask", json={"query": GIT_Q}).status_code == 401

    # /ask, JSON: asked as B first (its answer cached), then as A; routed and fallback.
    for mode in ("auto", "fallback"):
        for question in (SQLITE_Q, GIT_Q):
            as_b = client.post("/ask", json={"query": question, "mode": mode, "k": 5}, headers=b)
            assert as_b.status_code == 200, as_b.text
            as_a = client.post("/ask", json={"query": question, "mode": mode, "k": 5}, headers=a).json()
            secret.absent_from(_without_question(as_a), f"/ask {mode} {question!r}")
            for snippet in secret.texts:
                assert snippet not in (as_a["answer"] or "")
            assert {c["chunk_id"] for c in as_a["citations"]} <= a_chunks
            assert len(as_a["citations"]) == 5, as_a["route"]  # k results: A holds more than 5
            assert as_a["route"]["vectors_scanned"] <= len(a_chunks)  # nothing of B counted
            assert all(e["expert"]["name"] != "sqlite" for e in as_a["route"]["top"])
    # The stream's events.
    with client.stream("POST", "/ask", json={"query": SQLITE_Q, "stream": True}, headers=a) as r:
        events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    assert events and any(_chunk_ids(e) for e in events)  # the route event carries the citations
    secret.absent_from(events, "/ask stream")  # every event's words, texts and chunk ids
    # A forced expert outside the scope: not found, in the words of one that does not exist.
    r = client.post("/ask", json={"query": SQLITE_Q, "mode": "expert", "expert": experts["sqlite"]}, headers=a)
    assert r.status_code == 404 and r.json()["error"]["message"] == f"no expert {experts['sqlite']}"

    # /search: only A's chunks, k of them.
    hits = client.post("/search", json={"query": SQLITE_Q, "k": 5}, headers=a).json()
    secret.absent_from(hits, "/search")
    assert len(hits["hits"]) == 5 and {h["chunk_id"] for h in hits["hits"]} <= a_chunks
    assert hits["vectors_scanned"] == len(a_chunks) and hits["clusters_scanned"] == len(_lists_of(rt, a_chunks))

    # Documents and chunks.
    page = client.get("/documents?limit=100", headers=a).json()
    secret.absent_from(page, "/documents")
    assert page["total"] == len(page["items"]) and all(i["source"].startswith("git-") for i in page["items"])
    assert client.get("/documents?q=sqlite", headers=a).json()["total"] == 0
    r = client.get(f"/documents/{b_doc}", headers=a)
    assert r.status_code == 404 and r.json()["error"]["message"] == f"document {b_doc} not found"
    r = client.get(f"/chunks/{b_chunk}", headers=a)
    assert r.status_code == 404 and r.json()["error"]["message"] == f"chunk {b_chunk} not found"
    assert client.get(f"/documents/{b_doc}", headers=b).status_code == 200  # B reads its own
    one = min(a_chunks)
    secret.absent_from(client.get(f"/chunks/{one}", headers=a).json(), "/chunks")

    # The OpenAI API: models, and chat answered within the scope.
    models = [m["id"] for m in client.get("/v1/models", headers=a).json()["data"]]
    assert not any("sqlite" in m or m.endswith(f"expert-{experts['sqlite']}") for m in models), models
    assert client.get("/v1/models/moerag/sqlite", headers=a).status_code == 404
    done = client.post(
        "/v1/chat/completions", json={"model": "moerag", "messages": [{"role": "user", "content": SQLITE_Q}]}, headers=a
    ).json()
    secret.absent_from(done["moerag"], "/v1/chat/completions")
    r = client.post(
        "/v1/chat/completions",
        json={"model": "moerag/sqlite", "messages": [{"role": "user", "content": SQLITE_Q}]},
        headers=a,
    )
    assert r.status_code == 404

    # /stats counts what the scope holds, nothing else.
    assert client.get("/stats", headers=a).json() == {
        "documents": len(a_docs),
        "chunks": len(a_chunks),
        "clusters": len(_lists_of(rt, a_chunks)),
        "index_vectors": len(a_chunks),
        "shards": None,
    }
    # Prometheus's metrics answer for the whole server: refused to a scoped token.
    r = client.get("/metrics", headers=a)
    assert r.status_code == 403 and r.json()["error"]["code"] == "scoped_token", r.text
    # Jobs: only its own (it ran none); another's is not found, as one that does not exist.
    assert client.get("/jobs", headers=a).json() == {"items": [], "total": 0, "offset": 0, "limit": 50}
    assert client.get(f"/jobs/{routed['job']['id']}", headers=a).status_code == 404

    # MCP (the SDK's server at /mcp): every tool and resource within the scope.
    experts_seen = _mcp(client, a, "tools/call", {"name": "list_experts", "arguments": {}})
    assert "sqlite" not in json.dumps(experts_seen) and experts_seen["structuredContent"]["result"]
    asked = _mcp(client, a, "tools/call", {"name": "ask", "arguments": {"question": SQLITE_Q, "k": 5}})
    answer = asked["structuredContent"]
    secret.absent_from(_without_question(answer), "MCP ask")
    assert len(answer["citations"]) == 5 and {c["chunk_id"] for c in answer["citations"]} <= a_chunks
    found = _mcp(client, a, "tools/call", {"name": "search", "arguments": {"query": SQLITE_Q, "k": 5}})
    secret.absent_from(found["structuredContent"], "MCP search")
    assert len(found["structuredContent"]["hits"]) == 5
    listing = _mcp(client, a, "resources/read", {"uri": "moerag://documents"})["contents"][0]["text"]
    secret.absent_from(listing, "MCP moerag://documents")
    assert {d["id"] for d in json.loads(listing)} == {i["id"] for i in page["items"]}
    # Outside the scope is not found, in the words of what does not exist.
    for call, missing in [
        ({"name": "get_chunk", "arguments": {"chunk_id": b_chunk}}, f"chunk {b_chunk} not found"),
        ({"name": "ask", "arguments": {"question": SQLITE_Q, "expert": "sqlite"}}, "no expert named 'sqlite'"),
        ({"name": "search", "arguments": {"query": SQLITE_Q, "expert": "sqlite"}}, "no expert named 'sqlite'"),
    ]:
        refused = _mcp(client, a, "tools/call", call)
        assert refused.get("isError") and missing in refused["content"][0]["text"], refused
        secret.absent_from(refused["content"][0]["text"].replace("'sqlite'", ""), f"MCP {call['name']} refusal")
    unseen = _mcp(client, a, "resources/read", {"uri": f"moerag://documents/{b_doc}"}, error=True)
    assert f"document {b_doc} not found" in unseen["message"] and "sqlite" not in json.dumps(unseen)
    assert (
        "git"
        in _mcp(client, a, "resources/read", {"uri": f"moerag://documents/{min(a_docs)}"})["contents"][0][
            "text"
        ].lower()
    )
    assert set(client.get("/readyz", headers=a).json()) == {"status", "pid"}

    # Conversations belong to the token that made them: B's id, asked by A, is a conversation of
    # A's own (B's turns are neither rewritten into its follow-up nor listed nor read).
    conv = f"team-{kind}"
    assert client.post("/ask", json={"query": SQLITE_Q, "conversation_id": conv}, headers=b).status_code == 200
    follow = client.post("/ask", json={"query": "and how often does that happen?", "conversation_id": conv}, headers=a)
    assert follow.status_code == 200 and "sqlite" not in (follow.json()["standalone_question"] or "").lower()
    secret.absent_from(_without_question(follow.json()), "a conversation's follow-up")
    mine = client.get(f"/conversations/{conv}", headers=a).json()
    assert len(mine["turns"]) == 1
    secret.absent_from(
        {k: v for k, v in mine.items() if k != "turns"} | {"turns": [t for t in mine["turns"] if t["answer"]]},
        "a conversation",
    )
    assert [c["id"] for c in client.get("/conversations", headers=a).json()["items"]] == [conv]
    assert len(client.get(f"/conversations/{conv}", headers=AUTH).json()["turns"]) == 2  # the admin reads both


def test_an_expert_the_scope_holds_part_of_is_searched_within_it_unnamed(
    client: TestClient, routed: dict[str, Any]
) -> None:
    """A scope of half the git documents: a git question still takes the git expert's path (its
    lists only, within the scope: k results), but the route names no expert, uses none of its
    prompt, and counts no vector outside the scope; the other half's chunks never appear."""
    rt = client.app.state.runtime  # type: ignore[attr-defined]
    half = [f"git-{i}" for i in range(4)]
    a = _token(client, "half-git", {"source_prefixes": half})
    hidden = Secrets(rt, "git", "git")  # every git document: those of the scope are taken out below
    with rt.sessions() as s:
        mine = set(s.scalars(select(Chunk.id).join(Document).where(Document.source.in_([f"{h}.md" for h in half]))))
    assert len(mine) >= 3 and mine < hidden.chunk_ids
    hidden.chunk_ids -= mine
    with rt.sessions() as s:
        rest = s.execute(
            select(Document.source, Document.title).where(
                Document.source.startswith("git-"), Document.source.not_in([f"{h}.md" for h in half])
            )
        ).all()
    hidden.words = {w for row in rest for w in row}
    hidden.texts = [f"(variant {i}." for i in range(len(half), 8)]  # what tells the documents' texts apart
    whole = client.post("/ask", json={"query": GIT_Q, "k": 5}, headers=AUTH).json()
    assert whole["route"]["path"] == "expert" and whole["route"]["expert"]["name"] == "git", whole["route"]
    body = client.post("/ask", json={"query": GIT_Q, "k": 3}, headers=a).json()
    route = body["route"]
    assert route["path"] == "expert" and route["reason"] == "confident", (route["reason"], route["detail"])
    assert route["expert"] is None and "git" not in json.dumps(route) and "not named" in route["detail"]
    assert route["vectors_scanned"] <= len(mine) < whole["route"]["vectors_scanned"]
    assert len(body["citations"]) == 3 and {c["chunk_id"] for c in body["citations"]} <= mine
    hidden.absent_from(_without_question(body), "/ask, an expert held in part")
    with client.stream("POST", "/ask", json={"query": GIT_Q, "k": 3, "stream": True}, headers=a) as r:
        events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    assert "git'" not in json.dumps(events) and _chunk_ids(events)
    assert set(_chunk_ids(events)) <= mine
    # An expert of which the scope holds fewer chunks than the answer takes is not routed to.
    few = _token(client, "one-git", {"source_prefixes": ["git-0"]})
    with rt.sessions() as s:
        held = len(s.scalars(select(Chunk.id).join(Document).where(Document.source == "git-0.md")).all())
    r = client.post("/ask", json={"query": GIT_Q, "k": held + 1}, headers=few).json()
    assert r["route"]["path"] == "fallback" and r["route"]["reason"] == "out_of_scope", r["route"]
    assert len(r["citations"]) == held


def test_a_revoked_or_expired_token_is_refused_at_its_next_request(client: TestClient, routed: dict[str, Any]) -> None:
    a = _token(client, "reader", {"source_prefixes": ["git-"]})
    assert client.post("/search", json={"query": GIT_Q}, headers=a).status_code == 200
    [row] = [t for t in client.get("/admin/api/tokens", headers=AUTH).json() if t["name"] == "reader"]
    assert client.delete(f"/admin/api/tokens/{row['id']}", headers=AUTH).json()["revoked"] is True
    r = client.post("/search", json={"query": GIT_Q}, headers=a)
    assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]
    short = _token(client, "short", {"source_prefixes": ["git-"]}, expires_days=0.5 / 86400)  # half a second
    time.sleep(0.6)
    assert client.post("/search", json={"query": GIT_Q}, headers=short).status_code == 401
    assert (
        client.post("/search", json={"query": GIT_Q}, headers={"Authorization": "Bearer mrg_made-up"}).status_code
        == 401
    )
    # The admin token still reads everything; an unscoped read token reads the whole store.
    whole = _token(client, "everything", None)
    assert client.post("/search", json={"query": SQLITE_Q, "k": 3}, headers=whole).status_code == 200
    assert client.get("/stats", headers=whole).status_code == 200
    r = client.post("/admin/api/tokens", json={"name": "boss", "role": "admin", "scope": {"tags": ["x"]}}, headers=AUTH)
    assert r.status_code == 422 and "admin token reads everything" in r.text
    assert client.post("/admin/api/tokens", json={"name": "reader", "scope": None}, headers=AUTH).status_code == 422


def test_a_write_token_writes_within_its_scope_only(client: TestClient, routed: dict[str, Any]) -> None:
    """A write token reads as a read token of its scope and writes documents that lie in it (by tag
    or source prefix): one outside is refused and nothing is stored; another's document is not
    found to it; the same bytes stored outside its scope are a conflict that names nothing."""
    rt = client.app.state.runtime  # type: ignore[attr-defined]
    _tag(rt)
    r = client.post(
        "/admin/api/tokens",
        json={"name": "w-expert", "role": "write", "scope": {"experts": [routed["experts"]["git"]]}},
        headers=AUTH,
    )
    assert r.status_code == 422 and "names tags or source_prefixes" in r.text
    w = _token(client, "writer", {"tags": ["team-a"]}, role="write")
    secret = Secrets(rt, "sqlite", "sqlite")
    b_doc = min(secret.doc_ids)
    stored = client.get("/stats", headers=AUTH).json()["documents"]

    note = "# Okapi ferry\n\nThe okapi ferry crosses the lake at dawn, twice a day in summer. " * 4
    made = client.post("/documents", json={"text": note, "metadata": {"tags": ["team-a"]}}, headers=w)
    assert made.status_code == 201, made.text
    hits = client.post("/search", json={"query": "okapi ferry crossing", "k": 1}, headers=w).json()["hits"]
    assert hits[0]["document_id"] == made.json()["id"]
    upload = {"file": ("ferry.md", b"# Ferry\n\nThe okapi ferry timetable, winter edition. " * 4, "text/markdown")}
    assert client.post("/documents", files=upload, data={"tags": "team-a, more"}, headers=w).status_code == 201
    # Outside the scope: refused, naming the token's own scope only; nothing stored.
    for outside in (
        {"json": {"text": note + " Untagged.", "metadata": {}}},
        {"json": {"text": note + " Theirs.", "metadata": {"tags": ["team-b"]}}},
        {"files": {"file": ("x.md", b"# X\n\nAn untagged file of text. " * 4, "text/markdown")}},
    ):
        r = client.post("/documents", headers=w, **outside)  # type: ignore[arg-type]
        assert r.status_code == 403 and r.json()["error"]["code"] == "out_of_scope", r.text
        assert "team-a" in r.json()["error"]["message"]
    assert client.get("/stats", headers=AUTH).json()["documents"] == stored + 2
    # B's document: not found to the writer, as one that does not exist; the admin still has it.
    missing = client.delete("/documents/999999", headers=w).json()["error"]["message"].replace("999999", "N")
    for r in (
        client.put(f"/documents/{b_doc}", json={"text": note + " Overwritten."}, headers=w),
        client.delete(f"/documents/{b_doc}", headers=w),
    ):
        assert r.status_code == 404 and r.json()["error"]["message"].replace(str(b_doc), "N") == missing
    assert client.get(f"/documents/{b_doc}", headers=AUTH).status_code == 200
    # The same bytes as B's document: a conflict that names nothing of it.
    same = {"file": ("mine.md", topic_doc("sqlite", 0, paragraphs=4).encode(), "text/markdown")}
    r = client.post("/documents", files=same, data={"tags": "team-a"}, headers=w)
    assert r.status_code == 409, r.text
    secret.absent_from(r.json(), "a duplicate's conflict")
    assert str(b_doc) not in r.text
    # Its own document: moved out of its scope is refused (unchanged); replaced and deleted within.
    own = made.json()["id"]
    r = client.put(f"/documents/{own}", json={"text": note + " Moved.", "metadata": {"tags": ["team-b"]}}, headers=w)
    assert r.status_code == 403 and client.get(f"/documents/{own}", headers=AUTH).json()["metadata"]["tags"] == [
        "team-a"
    ]
    r = client.put(f"/documents/{own}", json={"text": note + " Revised."}, headers=w)
    assert r.status_code == 200 and r.json()["status"] == "updated"
    assert client.delete(f"/documents/{own}", headers=w).json()["deleted"] is True
    # Bulk uploads: every file within the scope (the `tags` field), or none is taken.
    files = [
        ("files", ("a.md", b"# Alpaca\n\nThe alpaca barge leaves at noon. " * 6, "text/markdown")),
        ("files", ("b.md", topic_doc("sqlite", 1, paragraphs=4).encode(), "text/markdown")),  # B's bytes
    ]
    before = client.get("/stats", headers=AUTH).json()["documents"]
    r = client.post("/documents/bulk", files=files, headers=w)  # untagged: outside
    assert r.status_code == 403 and r.json()["error"]["code"] == "out_of_scope" and "'a.md'" in r.text
    bulk = client.post("/documents/bulk", files=files, data={"tags": "team-a"}, headers=w)
    assert bulk.status_code == 202, bulk.text
    job = wait_job(client, bulk.json()["id"], headers=w)
    assert job["status"] == "done" and job["result"]["created"] == 1 and job["result"]["failed"] == 1, job
    [failure] = job["result"]["failures"]
    assert failure["source"] == "b.md" and "outside this token's scope" in failure["error"]
    secret.absent_from(job, "a bulk job's conflict")
    assert client.get("/stats", headers=AUTH).json()["documents"] == before + 1
    hits = client.post("/search", json={"query": "alpaca barge at noon", "k": 1}, headers=w).json()["hits"]
    assert hits[0]["source"] == "a.md"
    # Jobs: a scoped token lists and reads its own only; the admin reads them all.
    assert [j["id"] for j in client.get("/jobs", headers=w).json()["items"]] == [job["id"]]
    others = [j["id"] for j in client.get("/jobs?limit=500", headers=AUTH).json()["items"] if j["id"] != job["id"]]
    assert others  # the store's own build jobs
    r = client.get(f"/jobs/{others[0]}", headers=w)
    assert r.status_code == 404 and r.json()["error"]["message"] == f"job {others[0]} not found"
    # What a write token may not do: the admin API.
    assert client.get("/admin/api/tokens", headers=w).status_code == 401
    # A read token writes nothing.
    reader = _token(client, "reader", {"tags": ["team-a"]})
    assert (
        client.post("/documents", json={"text": note, "metadata": {"tags": ["team-a"]}}, headers=reader).status_code
        == 401
    )


def test_a_scope_in_use_is_ready_before_the_next_state_is_published(
    client: TestClient, routed: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a catalogue change, a scoped question does not read the chunk table on its path: the
    reach of every scope in use was made with the new state (app.serving.states' `prepare`), and
    it holds the new document of the scope."""
    rt = client.app.state.runtime  # type: ignore[attr-defined]
    _tag(rt)
    a = _token(client, "a", {"tags": ["team-a"]})
    assert client.post("/search", json={"query": GIT_Q}, headers=a).status_code == 200  # the scope is in use
    before = rt.state().version
    note = "# Okapi ferry\n\nThe okapi ferry crosses the lake at dawn, twice a day in summer. " * 4
    made = client.post("/documents", json={"text": note, "metadata": {"tags": ["team-a"]}}, headers=AUTH).json()
    deadline = time.monotonic() + 10
    while rt.state().version == before:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    read = rt.tokens._table

    def no_read(version: int) -> Any:
        raise AssertionError(f"the chunk table was read on a question's path (version {version})")

    def no_lists(ids: Any) -> Any:
        raise AssertionError("the scope's lists were read on a question's path")

    rt.tokens._table = no_read
    monkeypatch.setattr(rt.state().index, "clusters_of", no_lists)  # its counts too were made with the state
    try:
        found = client.post("/search", json={"query": "okapi ferry crossing", "k": 1}, headers=a).json()
    finally:
        rt.tokens._table = read
        monkeypatch.undo()
    hits = found["hits"]
    assert hits[0]["document_id"] == made["id"]
    with rt.sessions() as s:  # and they are the scope's: team A's chunks and the lists holding them
        team_a = Document.source.startswith("git-") | (Document.id == made["id"])
        mine = set(s.scalars(select(Chunk.id).join(Document).where(team_a)))
    assert (found["vectors_scanned"], found["clusters_scanned"]) == (len(mine), len(_lists_of(rt, mine)))
    # The chunk table followed the index log through a new document, a replacement that moves a
    # document out of the scope, and a deletion: each time what a whole read of SQL gives.
    from app.services.tokens import _read_table

    def followed_as_read() -> None:
        table = rt.tokens._chunk_table
        with rt.sessions() as s:
            whole = _read_table(s, table.version)
        assert np.array_equal(table.ids, whole.ids) and np.array_equal(table.owners, whole.owners)
        assert {d: table.docs[d] for d in set(table.owners.tolist())} == {
            d: whole.docs[d] for d in set(whole.owners.tolist())
        }

    def changed(request: Any) -> None:
        version = rt.state().version
        assert request().status_code in (200, 201)
        while rt.state().version == version:
            time.sleep(0.02)
        followed_as_read()

    from app.services import tokens as tokens_module

    whole_reads: list[int] = []
    monkeypatch.setattr(tokens_module, "_read_table", lambda s, v: whole_reads.append(v) or _read_table(s, v))
    followed_as_read()
    moved = {"text": note + " Moved to team B.", "metadata": {"tags": ["team-b"]}}
    changed(lambda: client.put(f"/documents/{made['id']}", json=moved, headers=AUTH))
    assert client.get(f"/documents/{made['id']}", headers=a).status_code == 404  # out of A's scope now
    changed(lambda: client.delete(f"/documents/{min(Secrets(rt, 'git', 'git').doc_ids)}", headers=AUTH))
    assert whole_reads == []  # followed by the log, never read whole again

    # A new version that moves none of what a reach is made of (the router activated again) keeps
    # the reach as it is; one that moves a chunk makes it anew.
    def reach() -> Any:
        state = rt.state()
        who = rt.tokens.resolve(a["Authorization"][7:])
        return rt.tokens.allowed(who, state.version, state.experts, state.index)

    kept = reach()
    router = rt.state().router.version_id
    changed(lambda: client.post(f"/admin/api/router/versions/{router}/activate", headers=AUTH))
    assert reach() is kept
    changed(lambda: client.delete(f"/documents/{max(Secrets(rt, 'git', 'git').doc_ids)}", headers=AUTH))
    assert reach() is not kept


def test_the_chunk_table_reads_alike_on_each_database(db_url: str) -> None:
    """The chunk table's read through the driver's own cursor (SQLite's and psycopg's): every
    chunk's id and document, ascending, and the documents' fields."""
    from sqlalchemy.orm import sessionmaker

    from app.core.db import make_engine
    from app.core.migrate import upgrade
    from app.services.tokens import _read_table

    engine = make_engine(db_url)
    upgrade(engine)
    sessions = sessionmaker(engine)
    with sessions.begin() as s:
        for d in range(3):
            doc = Document(
                source=f"team-{d}/a.md",
                mime="text/markdown",
                content_hash=f"{d:064d}",
                size=1,
                meta={"tags": [f"t{d}"]},
            )
            s.add(doc)
            s.flush()
            for o in range(4 - d):
                s.add(
                    Chunk(
                        document_id=doc.id,
                        ordinal=o,
                        text="x",
                        char_start=0,
                        char_end=1,
                        token_count=1,
                        cluster_id=o,
                        embedding=np.zeros(4, dtype=np.float32),
                    )
                )
    with sessions() as s:
        table = _read_table(s, 7)
        want = s.execute(select(Chunk.id, Chunk.document_id).order_by(Chunk.id)).all()
        docs = {d: (src, meta) for d, src, meta in s.execute(select(Document.id, Document.source, Document.meta))}
    engine.dispose()
    assert table.version == 7 and table.ids.dtype == np.int64 and len(want) == 9
    assert table.ids.tolist() == [i for i, _ in want] and table.owners.tolist() == [d for _, d in want]
    assert table.docs == docs


def test_the_cli_creates_lists_and_revokes_tokens(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli.main import main

    data = ["--data-dir", str(tmp_path / "data")]
    main([*data, "tokens", "create", "team-a", "--tag", "team-a", "--expires-days", "30", "--json"])
    made = json.loads(capsys.readouterr().out)
    assert made["secret"].startswith("mrg_") and made["token"]["scope"]["tags"] == ["team-a"]
    main([*data, "tokens", "list", "--json"])
    listed = capsys.readouterr().out
    assert made["secret"] not in listed and json.loads(listed)[0]["name"] == "team-a"
    main([*data, "tokens", "revoke", str(made["token"]["id"])])
    assert "revoked" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="exists already"):
        main([*data, "tokens", "create", "team-a"])


def test_an_id_set_holds_exactly_its_ids() -> None:
    """The bitmap FAISS reads is the membership every other check of a scope reads too."""
    from index.store import IdSet

    rng = np.random.default_rng(0)
    for n in (0, 1, 5, 1000):
        ids = np.unique(rng.integers(0, 5000, n))
        asked = rng.integers(-10, 6000, 3000)
        assert np.array_equal(IdSet(ids).contains(asked), np.isin(asked, ids)), n
