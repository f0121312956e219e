"""Scoped tokens: who may read what, enforced inside the searches, on every read surface.

The leak battery: two scopes A (git) and B (sqlite) over the same store, by tag, by source prefix
and by expert. A token scoped to A never receives a chunk id, text, title, source or expert name
of B, on any surface (JSON and streamed answers, cached answers asked first as B, search,
documents, chunks, the OpenAI models and chat, error bodies), and still gets k results where A
holds them; the surfaces not scoped yet refuse a scoped token. Then revocation and expiry."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.core.models import Chunk, Document
from tests.conftest import AUTH

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

    # Surfaces that answer for the whole store refuse a scoped token.
    for method, path in [("GET", "/stats"), ("GET", "/metrics"), ("GET", "/jobs")]:
        r = client.request(method, path, headers=a)
        assert r.status_code == 403 and r.json()["error"]["code"] == "scoped_token", (path, r.text)
    r = client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=a)
    assert r.status_code == 403
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
    from app.services.tokens import Tokens
    from engine.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="write tokens are not available yet"):
        Tokens(client.app.state.runtime.sessions).create("w", "write", None, None)  # type: ignore[attr-defined]


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
