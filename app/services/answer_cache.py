"""Questions asked again: their route and citations reused until anything they depend on changes.

An entry is filed under the serving state it was computed in (its serial, app.services.serving);
a lookup uses the state of now, so any catalogue change (a document, a mapping, an expert
setting, a router version) or a BM25 rebuild makes every older entry unreachable at once, and
the LRU bound evicts them. Nothing expires by time. A result whose state moved while it was
computed is not filed, nor is a partial one (a shard did not answer). The generator runs again
on every answer (an LLM's answer is not reused); the extractive one is cheap.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

from engine.pipeline import Prepared

Stamp = Hashable


class AnswerCache:
    def __init__(self, size: int, stamp: Callable[[], Stamp]) -> None:
        self.size, self.stamp = size, stamp
        self._entries: OrderedDict[tuple[Stamp, Hashable], Prepared] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def prepare(self, key: Hashable, compute: Callable[[], Prepared]) -> Prepared:
        """The cached result for `key` in the current state (a copy with its own timings), or compute it."""
        if self.size <= 0:
            return compute()
        t = time.perf_counter()
        before = self.stamp()
        with self._lock:
            found = self._entries.get((before, key))
            if found is not None:
                self._entries.move_to_end((before, key))
                self.hits += 1
        if found is not None:
            took = (time.perf_counter() - t) * 1000
            return dataclasses.replace(found, timings_ms={"cached": took}, started=t)
        prepared = compute()
        with self._lock:
            self.misses += 1
            # Filed under its state when computed in that state throughout, and whole (a shard
            # that did not answer is asked again next time).
            if self.stamp() == before and not prepared.route.missing_shards:
                self._entries[(before, key)] = prepared
                while len(self._entries) > self.size:
                    self._entries.popitem(last=False)
        return prepared
