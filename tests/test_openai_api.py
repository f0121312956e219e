"""The OpenAI-compatible API, driven by the official `openai` package against a live server on a
copy of the sample store, with a read token set (the API key): models, a plain and a streamed
completion that carry /ask's citations and route, a forced expert, a bad model, a missing key."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.conftest import READ_TOKEN, TOKEN
from tests.server import Server

QUESTION = "How do I generate a secure random token?"


@pytest.fixture(scope="module")
def live(sample_server: Server) -> Server:
    return sample_server


def _client(live: Server, key: str = READ_TOKEN) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key=key, max_retries=0, timeout=120)


def _ask(live: Server, **body: Any) -> dict[str, Any]:
    r = httpx.post(f"{live.url}/ask", json=body, headers={"Authorization": f"Bearer {READ_TOKEN}"}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _experts(live: Server) -> list[dict[str, Any]]:
    r = httpx.get(f"{live.url}/admin/api/experts", headers={"Authorization": f"Bearer {TOKEN}"})
    return r.json()["items"]  # type: ignore[no-any-return]


def _same_route(route: dict[str, Any], asked: dict[str, Any]) -> None:
    for field in ("path", "expert", "reason", "router_version", "catalogue_version"):
        assert route[field] == asked[field], field


def test_models_are_the_knowledge_base_and_one_per_expert(live: Server) -> None:
    ids = [m.id for m in _client(live).models.list()]
    per_expert = [
        [f"moerag/{e['slugs'][0]}", f"moerag/expert-{e['id']}"] for e in sorted(_experts(live), key=lambda e: e["id"])
    ]
    assert ids == ["moerag"] + [i for pair in per_expert for i in pair]
    assert len(ids) > 2


def test_plain_and_streamed_completions_carry_the_citations_and_route_of_ask(live: Server) -> None:
    asked = _ask(live, query=QUESTION)
    messages: Any = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}]
    plain = _client(live).chat.completions.create(model="moerag", messages=messages)
    extra = plain.model_extra["moerag"]  # type: ignore[index]
    text = plain.choices[0].message.content or ""
    assert plain.object == "chat.completion" and plain.choices[0].finish_reason == "stop"
    assert text.startswith(asked["answer"]) and "\n\nSources:\n[1] " in text
    assert [c["chunk_id"] for c in extra["citations"]] == [c["chunk_id"] for c in asked["citations"]]
    assert [c["used"] for c in extra["citations"]] == [c["used"] for c in asked["citations"]]
    _same_route(extra["route"], asked["route"])
    assert isinstance(extra["query_id"], int)

    chunks = list(_client(live).chat.completions.create(model="moerag", messages=messages, stream=True))
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    first, last = chunks[0].model_extra["moerag"], chunks[-1].model_extra["moerag"]  # type: ignore[index]
    _same_route(first["route"], asked["route"])
    assert [c["chunk_id"] for c in first["citations"]] == [c["chunk_id"] for c in asked["citations"]]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == "stop" and isinstance(last["query_id"], int)


def test_an_expert_model_asks_that_expert(live: Server) -> None:
    expert = _experts(live)[-1]
    done = _client(live).chat.completions.create(
        model=f"moerag/{expert['slugs'][0]}", messages=[{"role": "user", "content": QUESTION}]
    )
    route = done.model_extra["moerag"]["route"]  # type: ignore[index]
    assert route["path"] == "expert" and route["expert"] == {"id": expert["id"], "name": expert["name"]}
    asked = _ask(live, query=QUESTION, mode="expert", expert=expert["id"])
    _same_route(route, asked["route"])


def test_a_renamed_expert_answers_to_its_old_model_id(live: Server) -> None:
    expert = _experts(live)[0]
    url, auth = f"{live.url}/admin/api/experts/{expert['id']}", {"Authorization": f"Bearer {TOKEN}"}
    old = f"moerag/{expert['slugs'][0]}"
    renamed = httpx.patch(url, headers=auth, json={"name": "Renamed for clients"})
    try:
        assert renamed.status_code == 200 and renamed.json()["slugs"][:2] == ["renamed-for-clients", old[7:]]
        ids = [m.id for m in _client(live).models.list()]
        assert "moerag/renamed-for-clients" in ids and old not in ids and f"moerag/expert-{expert['id']}" in ids
        for model in (old, "moerag/renamed-for-clients", f"moerag/expert-{expert['id']}"):
            done = _client(live).chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}])
            assert done.model_extra["moerag"]["route"]["expert"]["id"] == expert["id"], model  # type: ignore[index]
    finally:
        back = httpx.patch(url, headers=auth, json={"name": expert["name"]})
        assert back.json()["slugs"][0] == old[7:]


def test_errors_come_in_openai_s_shape(live: Server) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        _client(live).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": QUESTION}])
    error = missing.value.response.json()["error"]
    assert error["code"] == "model_not_found" and error["type"] == "not_found_error" and "gpt-4o" in error["message"]
    with pytest.raises(openai.AuthenticationError) as unauthorised:
        _client(live, key="not-the-token").models.list()
    assert unauthorised.value.response.json()["error"]["type"] == "authentication_error"
    with pytest.raises(openai.UnprocessableEntityError) as no_question:
        _client(live).chat.completions.create(model="moerag", messages=[{"role": "system", "content": "Hi"}])
    assert "no user message" in no_question.value.response.json()["error"]["message"]


def test_the_spec_documents_the_openai_routes(live: Server) -> None:
    paths = httpx.get(f"{live.url}/openapi.json").json()["paths"]
    assert {"/v1/models", "/v1/chat/completions"} <= set(paths)


# Open WebUI's default title prompt (its DEFAULT_TITLE_GENERATION_PROMPT_TEMPLATE), as it sends it
# to the chat model with the chat's last messages filled in.
OPEN_WEBUI_TITLE = """### Task:
Generate a concise, 3-5 word title with an emoji summarizing the chat history.
### Guidelines:
- The title should clearly represent the main theme or subject of the conversation.
- Use emojis that enhance understanding of the topic, but avoid quotation marks or special formatting.
- Write the title in the chat's primary language; default to English if multilingual.
- Prioritize accuracy over excessive creativity; keep it clear and simple.
- Your entire response must consist solely of the JSON object, without any introductory or concluding text.
### Output:
JSON format: { "title": "your concise title here" }
### Examples:
- { "title": "📉 Stock Market Trends" },
- { "title": "🍪 Perfect Chocolate Chip Recipe" }
### Chat History:
<chat_history>
USER: How do I generate a secure random token in Python?
ASSISTANT: Use the secrets module: secrets.token_hex(32) [1].
</chat_history>"""


def test_usage_the_usage_chunk_and_one_model_by_id(live: Server) -> None:
    client = _client(live)
    done = client.chat.completions.create(model="moerag", messages=[{"role": "user", "content": QUESTION}])
    assert done.usage is not None and done.usage.prompt_tokens > 10 and done.usage.completion_tokens > 0
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens
    chunks = list(
        client.chat.completions.create(
            model="moerag",
            messages=[{"role": "user", "content": QUESTION}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None and last.usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])
    plain = list(
        client.chat.completions.create(model="moerag", messages=[{"role": "user", "content": QUESTION}], stream=True)
    )
    assert all(c.usage is None for c in plain) and all(c.choices for c in plain)  # no usage chunk unasked
    assert client.models.retrieve("moerag").id == "moerag"
    expert = client.models.list().data[-1].id
    assert client.models.retrieve(expert).id == expert
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("moerag/no-such-expert")


def test_a_chat_ui_s_title_prompt_gets_a_title_not_a_retrieval_answer(live: Server) -> None:
    import json

    client = _client(live)
    done = client.chat.completions.create(model="moerag", messages=[{"role": "user", "content": OPEN_WEBUI_TITLE}])
    text = done.choices[0].message.content or ""
    title = json.loads(text)["title"]
    assert 0 < len(title.split()) <= 5 and "secure random token" in title.lower(), text
    extra = done.model_extra["moerag"]  # type: ignore[index]
    assert extra["route"]["reason"] == "chat_ui_task" and not extra.get("citations")
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model="moerag", messages=[{"role": "user", "content": OPEN_WEBUI_TITLE}], stream=True
        )
        if c.choices
    )
    assert json.loads(streamed)["title"] == title
