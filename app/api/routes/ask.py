"""POST /ask (JSON or SSE stream) and GET /metrics."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Body, Request
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.api.deps import ReaderDep, RuntimeDep, WholeReaderDep, principal
from app.api.routes.flow import LogOnce, gate, threaded_stream
from app.runtime import Runtime
from app.schemas.api import AskIn, AskOut
from app.services.answering import Asked, answer_events, answer_json, prepare

router = APIRouter(tags=["ask"])
# What Swagger's "Try it out" pre-fills: without them it built a body from the schema, with
# `expert: 9223372036854776000` (int64's maximum, rounded by JavaScript), a 422.
ASK_EXAMPLES: dict[str, Any] = {
    "routed": {"summary": "Route, retrieve, answer", "value": {"query": "How do I undo the last commit?"}},
    "passages only": {
        "summary": "Route and retrieve, no generated answer",
        "value": {"query": "How do I undo the last commit?", "k": 3, "generate": False},
    },
    "fallback": {
        "summary": "Retrieval over the whole store",
        "value": {"query": "How do I undo the last commit?", "mode": "fallback", "generate": False},
    },
}
# One server-sent event: `route` (route and citations), `token` ({"text"}), `error`, `done`; data is JSON.
_SSE_EVENT = {
    "type": "object",
    "properties": {
        "event": {"type": "string", "enum": ["route", "token", "error", "done"]},
        "data": {"type": "string"},
    },
}


@router.post(
    "/ask",
    response_model=AskOut,
    dependencies=[ReaderDep],
    responses={200: {"content": {"text/event-stream": {"schema": _SSE_EVENT}}}},  # stream: true
)
async def ask(
    body: Annotated[AskIn, Body(openapi_examples=ASK_EXAMPLES)], request: Request, rt: RuntimeDep
) -> Response:
    """Route the question, retrieve, answer with numbered citations; the route says which path and why."""
    rt.asking += 1  # on the event loop: no other thread writes it
    try:
        return await _ask(body, request, rt)
    finally:
        rt.asking -= 1


async def _ask(body: AskIn, request: Request, rt: Runtime) -> Response:
    door = gate(request)
    await door.check_rate(request)
    slots = door.slots
    # Old field names still work for one release; the response says they are deprecated.
    headers = (
        {"Deprecation": "true", "X-Deprecated-Fields": ", ".join(body.deprecated_names)}
        if body.deprecated_names
        else None
    )
    who = principal(request)  # what the caller's token may read
    if body.stream:
        asked = await anyio.to_thread.run_sync(prepare, rt, body, who, limiter=slots)
        events = threaded_stream(rt, asked, lambda log: _events(asked, body, log))
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)
    # One hop to a worker thread for the whole answer, and the body serialised once (returning
    # the model would have FastAPI validate it again): each cost ~0.2 ms of the GIL a question.
    body_json = await anyio.to_thread.run_sync(answer_json, rt, body, who, limiter=slots)
    return Response(body_json, media_type="application/json", headers=headers)


def _events(asked: Asked, body: AskIn, log: LogOnce) -> Iterator[str]:
    for name, data in answer_events(asked, body, log):
        yield f"event: {name}\ndata: {json.dumps(data)}\n\n"


@router.get(
    "/metrics",
    tags=["system"],
    dependencies=[WholeReaderDep],
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}}}},
)
def metrics(rt: RuntimeDep) -> Response:
    """Prometheus exposition: requests by path and expert, confidence and latency histograms, balance."""
    return Response(generate_latest(rt.metrics.registry), media_type=CONTENT_TYPE_LATEST)
