"""Questions asked again: their route and citations reused until anything they depend on changes.

A question takes its serving state once (app.serving.states) and is computed in it alone; its
entry is filed under that state's serial and looked up by it, so any catalogue change (a
document, a mapping, an expert setting, a router version) or a BM25 rebuild makes every older
entry unreachable to the questions that take the new state, and the LRU bound evicts them.
Nothing expires by time. A partial result (a shard did not answer) is not filed. The generator runs again
on every answer (an LLM's answer is not reused); the extractive one is cheap.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

from engine.pipeline import Prepared


class AnswerCache:
    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[tuple[int, Hashable], Prepared] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def prepare(self, key: Hashable, serial: int, compute: Callable[[], Prepared]) -> Prepared:
        """The cached result for `key` in the serving state numbered `serial` (a copy with its own
        timings), or `compute` it in that state."""
        if self.size <= 0:
            return compute()
        t = time.perf_counter()
        with self._lock:
            found = self._entries.get((serial, key))
            if found is not None:
                self._entries.move_to_end((serial, key))
                self.hits += 1
        if found is not None:
            took = (time.perf_counter() - t) * 1000
            return dataclasses.replace(found, timings_ms={"cached": took}, started=t)
        prepared = compute()
        with self._lock:
            self.misses += 1
            # Filed whole only: a shard that did not answer is asked again next time.
            if not prepared.route.missing_shards:
                self._entries[(serial, key)] = prepared
                while len(self._entries) > self.size:
                    self._entries.popitem(last=False)
        return prepared
