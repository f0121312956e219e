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
- a batch that fails is retried one question at a time, so only the failing question fails;
- a question its caller says is answered alone (`submit(alone=True)`: no other answer in
  flight), that finds the other workers idle and nobody queued, runs on `encode_wide` (the
  model on several intra-op threads, where the runtime has one): the lone question of one
  client uses the cores the batching would otherwise leave idle.

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
    """Counters since start: calls to the model (wide: on several threads), questions embedded,
    cache hits, largest batch."""

    batches: int = 0
    questions: int = 0
    cache_hits: int = 0
    largest: int = 0
    wide: int = 0

    def add(self, n: int, wide: bool = False) -> None:
        self.batches += 1
        self.wide += wide
        self.questions += n
        self.largest = max(self.largest, n)


@dataclass
class _Pending:
    text: str
    future: Future[Vectors]
    alone: bool = False


class QuestionEncoder:
    """`encode(question) -> [1, D]`, safe from any number of threads.

    max_batch: most questions per model call; 1 turns batching off (each caller embeds in its
        own thread, as before).
    max_wait_ms: how long a batch waits for more questions once a worker is free (0: none).
    cache_size: questions remembered (exact text); 0 turns the cache off.
    workers: batch threads (model calls at once).
    encode_wide: the model on several threads, for a question embedded alone (None: never).
    """

    def __init__(
        self,
        encode: Encode,
        *,
        max_batch: int = 16,
        max_wait_ms: float = 0.0,
        cache_size: int = 1024,
        workers: int = 1,
        encode_wide: Encode | None = None,
    ) -> None:
        if max_batch < 1 or workers < 1:
            raise ValueError("max_batch and workers must be at least 1")
        self.workers = workers
        self._encode, self._encode_wide = encode, encode_wide
        self._running = 0  # model calls under way (guarded by _cond)
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

    def submit(self, question: str, alone: bool = False) -> Future[Vectors]:
        """The question's [1, D] vector, to come: the caller may work while a batch thread runs the
        model (done already on a cache hit; embedded in this thread with batching off, or when it
        runs wide).
        alone: no other answer is in flight, so the model may take every core (`encode_wide`). A
        wide call has no batch to wait for and its caller nothing to do meanwhile, so it runs in
        the caller's thread: handing it to a batch thread and back cost ~0.3 ms a question
        (`question-path.json`)."""
        hit = self._cached(question)
        if hit is not None:
            return done_future(hit)
        with self._cond:
            if self._closed:
                raise RuntimeError("the question encoder is closed")
            wide = self._widen(1, alone)
            here = wide or self.max_batch == 1
            if here:
                self._running += 1
        if not here:
            return self._submit(_Pending(question, Future(), alone))  # the batch thread remembers it
        vec = None
        try:
            vec = self._model(wide)([question])  # [1, D]
        finally:
            with self._cond:  # one lock for both: the count, and the stats of a call that returned
                self._running -= 1
                if vec is not None:
                    self.stats.add(1, wide)
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

    def _widen(self, n: int, alone: bool) -> bool:
        """Whether a call of `n` questions runs wide: one question, alone, nothing else running or
        queued (called holding _cond)."""
        return self._encode_wide is not None and n == 1 and alone and self._running == 0 and not self._queue

    def _model(self, wide: bool) -> Encode:
        return self._encode_wide if wide and self._encode_wide is not None else self._encode

    def _submit(self, pending: _Pending) -> Future[Vectors]:
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

    def _next_batch(self) -> tuple[list[_Pending], bool] | None:
        """The next batch and whether it runs wide; counted as running until `_run_batch` ends."""
        with self._cond:
            while True:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return None  # closed and drained
                self._wait_for_more()
                if self._queue:  # another worker may have taken them all while this one waited for more
                    break
            batch = self._queue[: self.max_batch]
            del self._queue[: self.max_batch]
            wide = self._widen(len(batch), batch[0].alone)
            self._running += 1
            return batch, wide

    def _wait_for_more(self) -> None:
        """Up to `max_wait` for the queue to fill a batch (called holding _cond, which waiting releases)."""
        deadline = time.monotonic() + self.max_wait
        while len(self._queue) < self.max_batch and not self._closed:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(left)

    def _run(self) -> None:
        while (next_batch := self._next_batch()) is not None:
            try:
                self._run_batch(*next_batch)
            finally:
                with self._cond:
                    self._running -= 1

    def _run_batch(self, batch: list[_Pending], wide: bool = False) -> None:
        try:
            vecs = self._model(wide)([p.text for p in batch])  # [B, D]
        except Exception as exc:  # isolate the failing question below
            if len(batch) == 1:
                batch[0].future.set_exception(exc)
                return
            log.warning("a batch of %d questions failed (%s); embedding them one at a time", len(batch), exc)
            for p in batch:
                self._run_batch([p])
            return
        with self._cond:
            self.stats.add(len(batch), wide)
        for i, p in enumerate(batch):
            vec = np.ascontiguousarray(vecs[i : i + 1])  # [1, D]
            self._remember(p.text, vec)
            p.future.set_result(vec)


def done_future(vec: Vectors) -> Future[Vectors]:
    """A vector already in hand, as `submit` returns one to come."""
    done: Future[Vectors] = Future()
    done.set_result(vec)
    return done
