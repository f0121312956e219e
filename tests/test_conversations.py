"""Conversations: a follow-up is made standalone before routing (engine.followup), the turns are
stored in SQL (both databases) and survive a restart; /ask, its stream and the OpenAI route."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from app.api.main import create_app
from app.core.settings import Settings
from app.runtime import Runtime
from engine.embedder import Embedder
from engine.followup import accepted, is_follow_up, make_standalone, rewrite_messages, standalone, standalone_chain
from tests.conftest import AUTH, TOKEN
from tests.helpers import TOPICS, topic_doc

FIRST = "How does a git rebase replay commits onto another branch?"


def test_the_follow_up_rule() -> None:
    assert standalone(FIRST, None) == FIRST  # a first question stands alone
    assert standalone("and how do I undo that?", FIRST) == f"{FIRST} and how do I undo that?"
    assert standalone("What about merges?", FIRST) == f"{FIRST} What about merges?"
    assert standalone("why?", FIRST) == f"{FIRST} why?"  # three words or fewer
    own = "Which command installs a Debian package with its dependencies?"
    assert not is_follow_up(own) and standalone(own, FIRST) == own
    cut = standalone("and that?", "x" * 50, limit=20)
    assert cut == "x" * 10 + " and that?" and len(cut) == 20
    assert standalone_chain([FIRST, "and merges?", "why?"]) == f"{FIRST} and merges? why?"


def test_a_model_rewrite_is_checked_and_the_rule_stands_in() -> None:
    history = [(FIRST, "git rebase replays each commit.")]
    said: list[list[dict[str, str]]] = []

    def model(reply: str) -> Any:
        def complete(messages: list[dict[str, str]]) -> str:
            said.append(messages)
            return reply

        return complete

    good = model("Rewritten question: How do I undo a git rebase that replayed commits?\nThe end.")
    assert make_standalone("and how do I undo that?", history, 2000, good) == (
        "How do I undo a git rebase that replayed commits?",
        "llm",
    )
    assert "Q: " + FIRST in said[0][-1]["content"] and "A: git rebase replays" in said[0][-1]["content"]
    # The previous question given back for a new one drops the question's own words: the rule decides.
    own = "Which command installs a Debian package with its dependencies?"
    assert make_standalone(own, history, 2000, model(FIRST)) == (own, None)
    assert make_standalone("and merges?", history, 2000, model("")) == (f"{FIRST} and merges?", "rule")
    assert make_standalone("why?", history, 2000, model("Why?")) == (f"{FIRST} why?", "rule")  # unresolved
    invented = model("How do I undo a package installed with apt?")  # words from nowhere in the conversation
    assert make_standalone("and how do I undo that?", history, 2000, invented)[1] == "rule"

    def down(messages: list[dict[str, str]]) -> str:
        raise OSError("connection refused")

    assert make_standalone("why?", history, 2000, down) == (f"{FIRST} why?", "rule")
    assert make_standalone(FIRST, [], 2000, down) == (FIRST, None)  # a first turn: no model asked
    assert accepted("x" * 30, "x" * 30, limit=20) is None  # over the question limit
    assert rewrite_messages("q", [(str(i), None) for i in range(9)])[-1]["content"].count("Q: ") == 3


def _ask(client: TestClient, **body: Any) -> dict[str, Any]:
    r = client.post("/ask", json=body)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_a_three_turn_conversation_routes_each_follow_up_with_its_topic(
    client: TestClient, routed: dict[str, Any]
) -> None:
    git = routed["experts"]["git"]
    one = _ask(client, query=FIRST, conversation_id="c-1")
    two = _ask(client, query="and how do I undo that?", conversation_id="c-1")
    alone = _ask(client, query="and how do I undo that?")  # the same words outside the conversation
    assert one["standalone_question"] == FIRST and one["conversation_id"] == "c-1"
    assert two["standalone_question"] == f"{FIRST} and how do I undo that?"
    assert two["route"]["path"] == "expert" and two["route"]["expert"]["id"] == git
    assert alone["standalone_question"] is None and alone["route"]["expert"] != {"id": git, "name": "git"}
    assert two["citations"] and all(c["source"].startswith("git-") for c in two["citations"])
    # The third turn, streamed: its route event says how it was read; the turn keeps the answer.
    with client.stream(
        "POST", "/ask", json={"query": "what about merges?", "conversation_id": "c-1", "stream": True}
    ) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events[0]["standalone_question"].startswith(f"{FIRST} and how do I undo that? what about merges?")
    streamed = "".join(e["text"] for e in events if "text" in e)
    turns = client.get("/conversations/c-1").json()["turns"]
    assert [t["question"] for t in turns] == [FIRST, "and how do I undo that?", "what about merges?"]
    assert turns[1]["standalone"] == two["standalone_question"] and turns[1]["answer"] == two["answer"]
    assert turns[1]["route"] == {
        "path": "expert",
        "expert": {"id": git, "name": "git"},
        "reason": two["route"]["reason"],
    }
    assert turns[1]["cited"] == [c["chunk_id"] for c in two["citations"]] and turns[2]["answer"] == streamed
    assert client.get("/conversations").json()["items"][0] == {
        "id": "c-1",
        "turns": 3,
        "last_at": turns[2]["created_at"],
    }
    # The OpenAI route reads the earlier user messages the same way.
    messages = [{"role": "user", "content": FIRST}, {"role": "assistant", "content": one["answer"]}]
    messages.append({"role": "user", "content": "and how do I undo that?"})
    done = client.post("/v1/chat/completions", json={"model": "moerag", "messages": messages}).json()
    assert done["moerag"]["standalone_question"] == two["standalone_question"]
    assert done["moerag"]["route"]["expert"] == {"id": git, "name": "git"}


def test_turns_survive_a_restart_and_are_deleted_on_both_databases(
    db_url: str, tmp_path: Path, embedder: Embedder
) -> None:
    settings = Settings(data_dir=tmp_path / "conv", database_url=db_url, admin_token=TOKEN)  # type: ignore[arg-type]

    def serve() -> TestClient:
        return TestClient(create_app(settings, runtime=Runtime(settings, embedder=embedder), start_in_background=False))

    with serve() as c:
        for topic in TOPICS:
            assert c.post("/documents", json={"text": topic_doc(topic, 0)}, headers=AUTH).status_code == 201
        asked = [_ask(c, query=q, conversation_id="kept") for q in (FIRST, "and merges?", "why?")]
        assert asked[2]["standalone_question"] == f"{FIRST} and merges? why?"
    with serve() as c:  # a new process on the same database
        turns = c.get("/conversations/kept").json()["turns"]
        assert [t["standalone"] for t in turns] == [a["standalone_question"] for a in asked]
        assert [t["query_id"] for t in turns] == [a["query_id"] for a in asked]
        follow = _ask(c, query="and rebases?", conversation_id="kept")
        assert follow["standalone_question"] == f"{FIRST} and merges? why? and rebases?"
        refused = c.delete("/conversations/kept")  # forgetting a conversation is a write: the admin token
        assert refused.status_code == 401 and c.get("/conversations/kept").status_code == 200, refused.text
        assert c.delete("/conversations/kept", headers=AUTH).status_code == 204
        assert c.get("/conversations/kept").status_code == 404
        assert c.delete("/conversations/kept", headers=AUTH).status_code == 404
        assert c.post("/ask", json={"query": "x", "conversation_id": "not a valid id"}).status_code == 422
