"""What every answering door shares (`/ask`, `/v1/chat/completions`, MCP's `ask`): the per-client
rate limit, the answer slots, and a stream made in worker threads that logs its question exactly once."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from app.runtime import Runtime
from app.services.answering import Asked, finish
from app.services.ratelimit import AnswerGate


def gate(request: Request) -> AnswerGate:
    """The app's answer gate."""
    found: AnswerGate = request.app.state.answer_gate
    return found


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
