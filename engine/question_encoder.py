"""How a question becomes a vector while serving: a small cache, then dynamic batching.

Embedding the question is most of an answer's cost, and a batch of eight short questions costs
little more than one (measured on 2 cores, bfloat16, one torch thread: 7.9 ms for one, 19.7 ms
for eight). So, as serving systems do (Triton Inference Server's dynamic batcher, Ray Serve's
`@serve.batch`, text-embeddings-inference), concurrent questions share one model call:

- a question that finds the model idle is embedded at once: no added wait at one client;
- questions that arrive while a batch runs queue up and go together in the next one, up to
  `max_batch`; `max_wait_ms` > 0 additionally holds a batch open that long for company;
- `workers` threads take batches from one queue, so with two cores two batches (or, at low load,
  two single questions) run at once, each on one torch thread (`Embedder.encode_questions`
  takes no lock);
- each caller gets its own row back as soon as its batch is done;
- a batch that fails is retried one question at a time, so only the failing question fails.

The cache maps the exact question text to its vector. The model is fixed for the life of the
process, so an entry is never stale whatever the catalogue does (no invalidation to get wrong).

Batching and exactness: in float32 a question's vector does not depend on its batch (measured
max difference 2e-7). In bfloat16 oneDNN rounds differently with the batch's shape and padding
(max 1.8e-3 on the dev questions); `benchmarks/load.py` reports what that does to the top 10.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

Vectors = npt.NDArray[np.float32]
Encode = Callable[[Sequence[str]], Vectors]  # [N] texts -> [N, D]


@dataclass
class BatchStats:
    """Counters since start: calls to the model, questions embedded, cache hits, largest batch."""

    batches: int = 0
    questions: int = 0
    cache_hits: int = 0
    largest: int = 0

    def add(self, n: int) -> None:
        self.batches += 1
        self.questions += n
        self.largest = max(self.largest, n)


@dataclass
class _Pending:
    text: str
    future: Future[Vectors]


class QuestionEncoder:
    """`encode(question) -> [1, D]`, safe from any number of threads.

    max_batch: most questions per model call; 1 turns batching off (each caller embeds in its
        own thread, as before).
    max_wait_ms: how long a batch waits for more questions once a worker is free (0: none).
    cache_size: questions remembered (exact text); 0 turns the cache off.
    workers: batch threads (model calls at once).
    """

    def __init__(
        self,
        encode: Encode,
        *,
        max_batch: int = 16,
        max_wait_ms: float = 0.0,
        cache_size: int = 1024,
        workers: int = 1,
    ) -> None:
        if max_batch < 1 or workers < 1:
            raise ValueError("max_batch and workers must be at least 1")
        self.workers = workers
        self._encode = encode
        self.max_batch, self.max_wait = max_batch, max_wait_ms / 1000
        self.cache_size = cache_size
        self._cache: OrderedDict[str, Vectors] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._queue: list[_Pending] = []
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self.stats = BatchStats()

    def encode(self, question: str) -> Vectors:
        """[1, D] float32, L2-normalised; from the cache, or embedded (batched with others in flight)."""
        return self.submit(question).result()

    def submit(self, question: str) -> Future[Vectors]:
        """The question's [1, D] vector, to come: the caller may work while a batch thread runs the
        model (done already on a cache hit, or with batching off: then embedded in this thread)."""
        hit = self._cached(question)
        if hit is not None:
            return done_future(hit)
        if self.max_batch > 1:
            return self._submit(question)  # the batch thread remembers it
        vec = self._encode([question])  # [1, D]
        with self._cond:
            self.stats.add(1)
        self._remember(question, vec)
        return done_future(vec)

    def close(self) -> None:
        """Stop the batch thread after the questions already queued; later calls raise."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            threads = list(self._threads)
        for t in threads:
            t.join(timeout=30)

    # -- cache ------------------------------------------------------------------------------

    def _cached(self, question: str) -> Vectors | None:
        if not self.cache_size:
            return None
        with self._cache_lock:
            vec = self._cache.get(question)
            if vec is not None:
                self._cache.move_to_end(question)
                self.stats.cache_hits += 1
            return vec

    def _remember(self, question: str, vec: Vectors) -> None:
        if not self.cache_size:
            return
        vec.setflags(write=False)  # shared by every later caller: nobody may change it
        with self._cache_lock:
            self._cache[question] = vec
            self._cache.move_to_end(question)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    # -- batching ---------------------------------------------------------------------------

    def _submit(self, question: str) -> Future[Vectors]:
        pending = _Pending(question, Future())
        with self._cond:
            if self._closed:
                raise RuntimeError("the question encoder is closed")
            self._queue.append(pending)
            if not self._threads:  # started on first use: after the server has set its torch threads
                for i in range(self.workers):
                    t = threading.Thread(target=self._run, name=f"moerag-question-batcher-{i}", daemon=True)
                    t.start()
                    self._threads.append(t)
            self._cond.notify()
        return pending.future

    def _next_batch(self) -> list[_Pending] | None:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if not self._queue:
                return None  # closed and drained
            if self.max_wait > 0:
                deadline = time.monotonic() + self.max_wait
                while len(self._queue) < self.max_batch and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            batch = self._queue[: self.max_batch]
            del self._queue[: self.max_batch]
            return batch

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            self._run_batch(batch)

    def _run_batch(self, batch: list[_Pending]) -> None:
        try:
            vecs = self._encode([p.text for p in batch])  # [B, D]
        except Exception as exc:  # isolate the failing question below
            if len(batch) == 1:
                batch[0].future.set_exception(exc)
                return
            log.warning("a batch of %d questions failed (%s); embedding them one at a time", len(batch), exc)
            for p in batch:
                self._run_batch([p])
            return
        with self._cond:
            self.stats.add(len(batch))
        for i, p in enumerate(batch):
            vec = np.ascontiguousarray(vecs[i : i + 1])  # [1, D]
            self._remember(p.text, vec)
            p.future.set_result(vec)


def done_future(vec: Vectors) -> Future[Vectors]:
    """A vector already in hand, as `submit` returns one to come."""
    done: Future[Vectors] = Future()
    done.set_result(vec)
    return done
