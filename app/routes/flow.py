"""What every answering route shares (`/ask`, `/v1/chat/completions`): the per-client rate limit,
the answer slots, and a stream made in worker threads that logs its question exactly once."""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator

import anyio
from fastapi import Request
from starlette.concurrency import run_in_threadpool

from app.errors import ApiError
from app.proxies import client_address
from app.runtime import Runtime
from app.services.answering import Asked, finish


async def check_rate(request: Request, rt: Runtime) -> None:
    """429 with Retry-After when this client asks faster than MOERAG_ASK_RATE allows (one SQL upsert, off the loop)."""
    if rt.ask_limiter is not None:
        wait = await run_in_threadpool(rt.ask_limiter.take, client_address(request, rt.settings.trusted_proxies))
        if wait:
            raise ApiError("rate_limited", f"too many questions from this client; retry in {wait:.0f} s",
                headers={"Retry-After": str(math.ceil(wait))},
            )  # fmt: skip


def answer_slots(request: Request, rt: Runtime) -> anyio.CapacityLimiter:
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


class LogOnce:
    """Logs a question (and its conversation turn) exactly once: at the end of its stream, with
    the answer streamed, or when the client cut it (marked)."""

    def __init__(self, rt: Runtime, asked: Asked) -> None:
        self.rt, self.asked = rt, asked
        self.lock = threading.Lock()
        self.done = False
        self.query_id: int | None = None

    def __call__(self, aborted: bool = False, answer: str | None = None) -> int | None:
        with self.lock:
            if not self.done:
                if aborted:
                    timings = self.asked.prepared.timings_ms
                    timings["aborted"] = timings["total"] = (time.perf_counter() - self.asked.prepared.started) * 1000
                self.query_id, self.done = finish(self.rt, self.asked, answer), True
            return self.query_id


async def threaded_stream(rt: Runtime, asked: Asked, events: Callable[[LogOnce], Iterator[str]]) -> AsyncIterator[str]:
    """`events(log)`'s items, each produced in a worker thread; a cut stream still logs its question.

    When the client goes away, this generator is closed (its `finally` runs) while the sync one
    would only be suspended forever: so the logging of a cut stream lives here, in a thread of
    its own (nothing may be awaited once the request is cancelled).
    """
    log = LogOnce(rt, asked)
    items = events(log)
    try:
        while (chunk := await run_in_threadpool(next, items, None)) is not None:
            yield chunk
    finally:
        if not log.done:
            threading.Thread(target=log, kwargs={"aborted": True}, name="moerag-log-cut", daemon=True).start()
