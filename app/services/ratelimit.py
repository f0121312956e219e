"""Per-client rate limit for every door that answers, shared by every worker: one GCRA bucket per
client in SQL; and the answer gate those doors pass (`AnswerGate`: the limit and the answer slots).

Off by default (MOERAG_ASK_RATE_PER_MINUTE=0). The generic cell rate algorithm keeps one number a
client, its theoretical arrival time `tat`: a question at `now` moves it to max(tat, now) + T
(T = 60 / per_minute) and is let through while that stays within `burst` intervals of now. The
check and the move are one upsert (`INSERT ... ON CONFLICT DO UPDATE ... WHERE ... RETURNING`,
the same on SQLite and PostgreSQL), atomic under any number of processes, so several workers (or
Ray replicas on one database) hold the limit together instead of each granting it again.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from typing import Any

import anyio
from sqlalchemy import Float, bindparam, case, delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from app.core.models import RateBucket
from app.core.proxies import client_address
from engine.errors import RateLimited

_TAT = select(RateBucket.tat).where(RateBucket.client == bindparam("client"))
_SWEEP_EVERY = 1024  # takes between deletions of spent buckets (a passed tat is the same as no row)


class RateLimiter:
    def __init__(self, engine: Engine, per_minute: float, burst: int | None = None) -> None:
        self.engine = engine
        self.interval = 60.0 / per_minute  # T: seconds a question costs
        self.burst = burst if burst is not None else max(1, math.ceil(per_minute / 6))  # 10 s worth
        self._takes = itertools.count(1)
        # The upsert, built once (as SqlChunkStore's read): only the client and the time vary.
        dialect: Any = postgresql if engine.dialect.name == "postgresql" else sqlite  # both upsert alike
        now = bindparam("now", type_=Float)
        moved = case((RateBucket.tat > now, RateBucket.tat), else_=now) + self.interval  # max(tat, now) + T
        self._take = (
            dialect.insert(RateBucket)
            .values(client=bindparam("client"), tat=now + self.interval)
            .on_conflict_do_update(
                index_elements=[RateBucket.client],
                set_={"tat": moved},
                where=moved - now <= self.burst * self.interval,
            )
            .returning(RateBucket.tat)
        )

    def take(self, client: str, now: float | None = None) -> float:
        """0.0 if the client may go on; else the seconds until it may (a Retry-After)."""
        now = time.time() if now is None else now
        client = client[:64]
        with self.engine.begin() as conn:
            if next(self._takes) % _SWEEP_EVERY == 0:
                conn.execute(delete(RateBucket).where(RateBucket.tat < now))
            if conn.execute(self._take, {"client": client, "now": now}).first() is not None:
                return 0.0
            tat = conn.execute(_TAT, {"client": client}).scalar_one()
        return max(tat, now) + self.interval - now - self.burst * self.interval


class AnswerGate:
    """What every door that answers shares (`/ask`, `/v1/chat/completions`, MCP's `ask`): the
    per-client rate limit and the answer slots. One per app."""

    def __init__(self, limiter: RateLimiter | None, trusted_proxies: str, concurrency: int) -> None:
        self.limiter, self.trusted_proxies, self.concurrency = limiter, trusted_proxies, concurrency
        self._slots: anyio.CapacityLimiter | None = None

    async def check_rate(self, request: HTTPConnection | None) -> None:
        """429 with Retry-After when this client asks faster than MOERAG_ASK_RATE allows (one SQL
        upsert, off the loop). No request (MCP over stdio): a local agent, no client to count."""
        if self.limiter is not None and request is not None:
            client = client_address(request, self.trusted_proxies)
            wait = await run_in_threadpool(self.limiter.take, client)
            if wait:
                raise RateLimited(f"too many questions from this client; retry in {wait:.0f} s", wait)

    @property
    def slots(self) -> anyio.CapacityLimiter:
        """Questions being answered at once (`MOERAG_ASK_CONCURRENCY`); the rest wait on the event loop.

        Answering is mostly Python under one GIL: more threads than this only queue for it, and a
        thread re-taking the GIL after every small torch or FAISS call waits behind all of them
        (16 clients, 40 threads: p95 211 ms; 4 threads: 160 ms, same throughput). Made on first use,
        inside the event loop (the loop is single-threaded: no race).
        """
        if self._slots is None:
            self._slots = anyio.CapacityLimiter(self.concurrency or 2 * (os.cpu_count() or 1))
        return self._slots
