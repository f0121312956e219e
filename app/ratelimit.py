"""Per-client rate limit for /ask: a token bucket per client address, in this process.

Off by default (MOERAG_ASK_RATE_PER_MINUTE=0). With several workers each holds its own
buckets, so the effective limit is per worker; put a proxy in front for a global one.
"""

from __future__ import annotations

import math
import threading
import time


class RateLimiter:
    def __init__(self, per_minute: float, burst: int | None = None) -> None:
        self.rate = per_minute / 60.0  # tokens a second
        self.capacity = float(burst if burst is not None else max(1, math.ceil(per_minute / 6)))
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, last refill)
        self._lock = threading.Lock()

    def take(self, client: str, now: float | None = None) -> float:
        """0.0 if the client may go on; else the seconds until it may (a Retry-After)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            tokens, last = self._buckets.get(client, (self.capacity, now))
            tokens = min(self.capacity, tokens + (now - last) * self.rate)
            if tokens >= 1.0:
                self._buckets[client] = (tokens - 1.0, now)
                self._forget_idle(now)
                return 0.0
            self._buckets[client] = (tokens, now)
            return (1.0 - tokens) / self.rate

    def _forget_idle(self, now: float) -> None:
        if len(self._buckets) > 10_000:  # a full bucket is the same as no bucket
            full = [c for c, (t, last) in self._buckets.items() if t + (now - last) * self.rate >= self.capacity]
            for c in full:
                del self._buckets[c]
