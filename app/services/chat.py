"""The OpenAI chat-completions use case: the knowledge base is the model.

`moerag` routes as `/ask` does; `moerag/<expert name>` asks that expert (mode=expert). The last
user message is the question. The answer's text ends with its numbered sources; citations, route,
query id and timings travel in the extra field `moerag`, as `/ask` returns them.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from app.errors import ApiError
from app.schemas import AskIn, CitationOut
from app.schemas_openai import AssistantMessage, ChatCompletionOut, ChatIn, Choice, ModelList, ModelOut, Moerag
from app.services.answering import citations, finish, prepare
from app.services.ask import route_json
from engine.generators import GeneratorError
from engine.pipeline import Prepared

if TYPE_CHECKING:
    from app.runtime import Runtime

MODEL = "moerag"
EXPERT_MODEL = MODEL + "/"  # + an expert's name
_LISTED_SINCE = int(time.time())  # the models' `created`


def models(rt: Runtime) -> ModelList:
    """`moerag`, then one `moerag/<name>` an expert, in id order."""
    names = [MODEL] + [EXPERT_MODEL + p.name for _, p in sorted(rt.experts.profiles().items())]
    return ModelList(data=[ModelOut(id=name, created=_LISTED_SINCE) for name in names])


def ask_body(rt: Runtime, body: ChatIn) -> AskIn:
    """The /ask request a chat request stands for: its model's mode and expert, its last user message."""
    if body.model == MODEL:
        mode, expert = "auto", None
    elif body.model.startswith(EXPERT_MODEL):
        name = body.model[len(EXPERT_MODEL) :]
        ids = [i for i, p in rt.experts.profiles().items() if p.name == name]
        if not ids:
            raise ApiError("model_not_found", f"the model {body.model!r} does not exist; GET /v1/models lists them")
        mode, expert = "expert", ids[0]
    else:
        raise ApiError("model_not_found", f"the model {body.model!r} does not exist; GET /v1/models lists them")
    return AskIn(query=_question(body), mode=mode, expert=expert)


def _question(body: ChatIn) -> str:
    users = [m for m in body.messages if m.role == "user"]
    if not users:
        raise ApiError("invalid_request", "the messages hold no user message: the last one is the question")
    content = users[-1].content
    if isinstance(content, list):
        if any(part.type != "text" for part in content):
            raise ApiError("invalid_request", "only text content parts are read")
        content = "\n".join(part.text or "" for part in content)
    if not content or not content.strip():
        raise ApiError("invalid_request", "the last user message is empty")
    return content


def sources(cited: list[CitationOut]) -> str:
    """The numbered sources appended to an answer's text ('' without passages)."""
    lines = [f"[{c.n}] {c.title or c.source} ({c.source})" for c in cited]
    return "\n\nSources:\n" + "\n".join(lines) if lines else ""


def completion_json(rt: Runtime, body: ChatIn) -> bytes:
    """One non-streamed completion, serialised (the route returns the bytes as they are)."""
    prepared = prepare(rt, ask_body(rt, body))
    try:
        answer = "".join(prepared.answer_stream())
    except GeneratorError as exc:
        raise ApiError("generator_failed", str(exc)) from None
    query_id = finish(rt, prepared)
    cited = citations(prepared, answer)
    out = ChatCompletionOut(
        id=_completion_id(),
        created=int(time.time()),
        model=body.model,
        choices=[Choice(message=AssistantMessage(content=answer + sources(cited)))],
        moerag=Moerag(
            route=route_json(prepared.route),
            citations=cited,
            query_id=query_id,
            timings_ms={k: round(v, 3) for k, v in prepared.timings_ms.items()},
        ),
    )
    return out.model_dump_json().encode()


def stream_chunks(prepared: Prepared, model: str, log: Callable[[], int | None]) -> Iterator[str]:
    """OpenAI's stream: `data: <chat.completion.chunk>` lines, then `data: [DONE]`. The first chunk
    (role) carries route and citations; the text comes as deltas, then the sources; the last chunk
    (finish_reason "stop") carries query_id and timings. A generator failure is an `error` event."""
    ident, created = _completion_id(), int(time.time())

    def chunk(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> str:
        body = {
            "id": ident,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
            **extra,
        }
        return f"data: {json.dumps(body)}\n\n"

    cited = citations(prepared)
    route = {"route": route_json(prepared.route), "citations": [c.model_dump() for c in cited]}
    yield chunk({"role": "assistant", "content": ""}, moerag=route)
    try:
        for delta in prepared.answer_stream():
            yield chunk({"content": delta})
    except GeneratorError as exc:
        log()
        error = {"message": str(exc), "type": "server_error", "param": None, "code": "generator_failed"}
        yield f"data: {json.dumps({'error': error})}\n\n"
        return
    if tail := sources(cited):
        yield chunk({"content": tail})
    query_id = log()
    yield chunk({}, "stop", moerag={"query_id": query_id, "timings_ms": prepared.timings_ms})
    yield "data: [DONE]\n\n"


def _completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"
