"""POST /ask (JSON or SSE stream) and GET /metrics."""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Body, Request
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from app.deps import ReaderDep, RuntimeDep
from app.errors import ApiError
from app.proxies import client_address
from app.runtime import Runtime
from app.schemas import AskIn, AskOut
from app.services.answering import answer_json, citations, finish, prepare
from app.services.ask import route_json
from engine.generators import GeneratorError
from engine.pipeline import Prepared

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
    if rt.ask_limiter is not None:  # one SQL upsert, off the event loop
        wait = await run_in_threadpool(rt.ask_limiter.take, client_address(request, rt.settings.trusted_proxies))
        if wait:
            raise ApiError("rate_limited", f"too many questions from this client; retry in {wait:.0f} s",
                headers={"Retry-After": str(math.ceil(wait))},
            )  # fmt: skip
    slots = _answer_slots(request, rt)
    # Old field names still work for one release; the response says they are deprecated.
    headers = (
        {"Deprecation": "true", "X-Deprecated-Fields": ", ".join(body.deprecated_names)}
        if body.deprecated_names
        else None
    )
    if body.stream:
        prepared = await anyio.to_thread.run_sync(prepare, rt, body, limiter=slots)
        return StreamingResponse(_sse(rt, prepared, body.generate), media_type="text/event-stream", headers=headers)
    # One hop to a worker thread for the whole answer, and the body serialised once (returning
    # the model would have FastAPI validate it again): each cost ~0.2 ms of the GIL a question.
    body_json = await anyio.to_thread.run_sync(answer_json, rt, body, limiter=slots)
    return Response(body_json, media_type="application/json", headers=headers)


def _answer_slots(request: Request, rt: Runtime) -> anyio.CapacityLimiter:
    """Questions being answered at once (`MOERAG_ASK_CONCURRENCY`); the rest wait on the event loop.

    Answering is mostly Python under one GIL: more threads than this only queue for it, and a
    thread re-taking the GIL after every small torch or FAISS call waits behind all of them
    (16 clients, 40 threads: p95 211 ms; 4 threads: 160 ms, same throughput). Made on first use,
    inside the event loop (the loop is single-threaded: no race).
    """
    slots: anyio.CapacityLimiter | None = getattr(request.app.state, "answer_slots", None)
    if slots is None:
        n = rt.settings.ask_concurrency or 2 * (os.cpu_count() or 1)
        slots = request.app.state.answer_slots = anyio.CapacityLimiter(n)
    return slots


class _LogOnce:
    """Logs a question exactly once: at the end of its stream, or when the client cut it (marked)."""

    def __init__(self, rt: Runtime, prepared: Prepared) -> None:
        self.rt, self.prepared = rt, prepared
        self.lock = threading.Lock()
        self.done = False
        self.query_id: int | None = None

    def __call__(self, aborted: bool = False) -> int | None:
        with self.lock:
            if not self.done:
                if aborted:
                    elapsed = (time.perf_counter() - self.prepared.started) * 1000
                    self.prepared.timings_ms["aborted"] = self.prepared.timings_ms["total"] = elapsed
                self.query_id, self.done = finish(self.rt, self.prepared), True
            return self.query_id


def _events(prepared: Prepared, generate: bool, log: _LogOnce) -> Iterator[str]:
    def event(name: str, data: object) -> str:
        return f"event: {name}\ndata: {json.dumps(data)}\n\n"

    yield event(
        "route",
        {"route": route_json(prepared.route), "citations": [c.model_dump() for c in citations(prepared)]},
    )
    if generate:
        try:
            for delta in prepared.answer_stream():
                yield event("token", {"text": delta})
        except GeneratorError as exc:
            yield event("error", {"code": "generator_failed", "message": str(exc)})
    query_id = log()
    yield event("done", {"timings_ms": prepared.timings_ms, "query_id": query_id})


async def _sse(rt: Runtime, prepared: Prepared, generate: bool) -> AsyncIterator[str]:
    """The events, each produced in a worker thread; a cut stream still logs its question.

    When the client goes away, this generator is closed (its `finally` runs) while the sync one
    would only be suspended forever: so the logging of a cut stream lives here, in a thread of
    its own (nothing may be awaited once the request is cancelled).
    """
    log = _LogOnce(rt, prepared)
    events = _events(prepared, generate, log)
    try:
        while (chunk := await run_in_threadpool(next, events, None)) is not None:
            yield chunk
    finally:
        if not log.done:
            threading.Thread(target=log, kwargs={"aborted": True}, name="moerag-log-cut", daemon=True).start()


@router.get(
    "/metrics",
    tags=["system"],
    dependencies=[ReaderDep],
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}}}},
)
def metrics(rt: RuntimeDep) -> Response:
    """Prometheus exposition: requests by path and expert, confidence and latency histograms, balance."""
    return Response(generate_latest(rt.metrics.registry), media_type=CONTENT_TYPE_LATEST)
