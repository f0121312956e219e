"""The OpenAI-compatible API: GET /v1/models, POST /v1/chat/completions (JSON or OpenAI's stream).

The read token (MOERAG_READ_TOKEN), when set, is the API key. Errors carry OpenAI's `type` and
`param` beside moerag's `code` and `message` (app.core.errors)."""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from app.api.deps import ReaderDep, RuntimeDep, principal
from app.api.routes.flow import gate, threaded_stream
from app.schemas.openai import ChatCompletionOut, ChatIn, ModelList, ModelOut
from app.services import chat

router = APIRouter(prefix="/v1", tags=["openai"], dependencies=[ReaderDep])
# One server-sent event: data is a chat.completion.chunk as JSON, the last one `[DONE]`.
_STREAM = {"text/event-stream": {"schema": {"type": "object", "properties": {"data": {"type": "string"}}}}}


@router.get("/models", response_model=ModelList)
def models(rt: RuntimeDep, request: Request) -> ModelList:
    """The knowledge base as models: `moerag` (routed as /ask), and per expert `moerag/<slug>` and
    `moerag/expert-<id>`."""
    return chat.models(rt, principal(request))


@router.get("/models/{model_id:path}", response_model=ModelOut)
def model(model_id: str, request: Request, rt: RuntimeDep) -> ModelOut:
    """One model by its id (`moerag`, `moerag/<slug>`, `moerag/expert-<id>`); 404 model_not_found."""
    return chat.model(rt, model_id, principal(request))


@router.post("/chat/completions", response_model=ChatCompletionOut, responses={200: {"content": _STREAM}})
async def chat_completions(body: ChatIn, request: Request, rt: RuntimeDep) -> Response:
    """The last user message answered from the knowledge base; citations and route in `moerag`."""
    door = gate(request)
    await door.check_rate(request)
    slots = door.slots
    if (task := chat.ui_task(body)) is not None:  # the chat UI's own prompt (a title...): no retrieval
        whole, events = await anyio.to_thread.run_sync(chat.task_completion, rt, body, task, limiter=slots)
        if events is not None:
            return StreamingResponse(iter(events), media_type="text/event-stream")
        return Response(whole, media_type="application/json")
    who = principal(request)  # what the caller's token may read
    rt.asking += 1  # on the event loop: no other thread writes it
    try:
        if body.stream:
            asked = await anyio.to_thread.run_sync(chat.prepare_chat, rt, body, who, limiter=slots)
            usage = body.stream_options is not None and body.stream_options.include_usage
            stream = threaded_stream(rt, asked.asked, lambda log: chat.stream_chunks(rt, asked, body.model, log, usage))
            return StreamingResponse(stream, media_type="text/event-stream")
        return Response(
            await anyio.to_thread.run_sync(chat.completion_json, rt, body, who, limiter=slots),
            media_type="application/json",
        )
    finally:
        rt.asking -= 1
