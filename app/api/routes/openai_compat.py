"""The OpenAI-compatible API: GET /v1/models, POST /v1/chat/completions (JSON or OpenAI's stream).

The read token (MOERAG_READ_TOKEN), when set, is the API key. Errors carry OpenAI's `type` and
`param` beside moerag's `code` and `message` (app.core.errors)."""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from app.api.deps import ReaderDep, RuntimeDep
from app.api.routes.flow import gate, threaded_stream
from app.schemas.openai import ChatCompletionOut, ChatIn, ModelList
from app.services import chat

router = APIRouter(prefix="/v1", tags=["openai"], dependencies=[ReaderDep])
# One server-sent event: data is a chat.completion.chunk as JSON, the last one `[DONE]`.
_STREAM = {"text/event-stream": {"schema": {"type": "object", "properties": {"data": {"type": "string"}}}}}


@router.get("/models", response_model=ModelList)
def models(rt: RuntimeDep) -> ModelList:
    """The knowledge base as models: `moerag` (routed as /ask), and per expert `moerag/<slug>` and
    `moerag/expert-<id>`."""
    return chat.models(rt)


@router.post("/chat/completions", response_model=ChatCompletionOut, responses={200: {"content": _STREAM}})
async def chat_completions(body: ChatIn, request: Request, rt: RuntimeDep) -> Response:
    """The last user message answered from the knowledge base; citations and route in `moerag`."""
    door = gate(request)
    await door.check_rate(request)
    slots = door.slots
    rt.asking += 1  # on the event loop: no other thread writes it
    try:
        if body.stream:
            asked = await anyio.to_thread.run_sync(chat.prepare_chat, rt, body, limiter=slots)
            stream = threaded_stream(rt, asked.asked, lambda log: chat.stream_chunks(asked, body.model, log))
            return StreamingResponse(stream, media_type="text/event-stream")
        return Response(
            await anyio.to_thread.run_sync(chat.completion_json, rt, body, limiter=slots),
            media_type="application/json",
        )
    finally:
        rt.asking -= 1
