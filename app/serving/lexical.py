"""Keeps the BM25 index in step with SQL: built at start-up, rebuilt after changes (debounced).

A rebuild reads and indexes every chunk (4.6 s for 47k chunks on one core here). Under steady
ingestion a rebuild at every checkpoint kept a core of a 2-core machine half busy and doubled
the /ask p95 in the soak, so rebuilds are spaced to take at most `max_share` of the time:
after a rebuild of t seconds the next waits t * (1 / max_share - 1). Until then new chunks
are found by dense search alone, and deleted ones are dropped when their rows are fetched.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.core.db import make_engine, make_sessionmaker
from app.core.lifeline import helpers_die_with_this_process
from app.core.locking import exit_with_parent
from app.core.models import Chunk, FloatVector, stack
from app.store.catalogue import read_version
from engine.central_sample import CentralSample, build_sample, sample_share, sampled
from engine.lexical import LexicalIndex

log = logging.getLogger(__name__)


def build(sessions: sessionmaker[Session], postings: bool = True) -> tuple[LexicalIndex, int]:
    """BM25 over every chunk, and the catalogue version it was read at (its rows are that version's or
    later); postings=False: its global statistics alone (the postings live on expert shards)."""
    lexical, version, _ = build_with_sample(sessions, postings, 0.0)
    return lexical, version


def build_with_sample(
    sessions: sessionmaker[Session], postings: bool = True, share: float = 0.0
) -> tuple[LexicalIndex, int, CentralSample | None]:
    """`build`, and in the same read the central sample of `share` of the chunks (engine.central_sample;
    None for share 0): their vectors and postings, scored with the BM25 statistics built here."""
    with sessions() as s:
        version = read_version(s)
        rows = s.execute(select(Chunk.id, Chunk.heading, Chunk.text).order_by(Chunk.id)).all()
        ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))  # [N] ascending
        texts = [f"{r[1]}\n{r[2]}" for r in rows]
        lexical = LexicalIndex(ids.tolist(), texts, postings=postings)
        effective = sample_share(len(rows), share)
        if not effective:
            return lexical, version, None
        keep = np.flatnonzero(sampled(ids, effective))  # [S] rows
        chosen = ids[keep].tolist()
        vectors: dict[int, FloatVector] = {}
        for start in range(0, len(chosen), _IN_BATCH):
            batch = chosen[start : start + _IN_BATCH]
            vectors |= dict(s.execute(select(Chunk.id, Chunk.embedding).where(Chunk.id.in_(batch))).tuples().all())
    dim = next(iter(vectors.values())).shape[0] if vectors else 0
    x = stack((vectors[i] for i in chosen), dim)  # [S, D]
    return lexical, version, build_sample(ids[keep], x, [texts[r] for r in keep], lexical.stats, effective)


_IN_BATCH = 900  # ids an IN (...) names at most (SQLite's default bound on variables was 999)


def _build_at(url: str, postings: bool, share: float) -> tuple[LexicalIndex, int, CentralSample | None]:
    """`build_with_sample` in a child process: its own engine on the same database."""
    engine = make_engine(url)
    try:
        return build_with_sample(make_sessionmaker(engine), postings, share)
    finally:
        engine.dispose()


def _worker_start(niceness: int, parent: int) -> None:
    """A rebuild worker's start: a lower priority, and an end with the server that started it
    (a SIGKILLed server would otherwise leave it, and multiprocessing's resource tracker, forever)."""
    os.nice(niceness)
    exit_with_parent(parent)


class LexicalManager:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        max_share: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        *,
        in_child: bool = False,
        niceness: int = 10,
        postings: bool = True,
        sample: float = 0.0,
    ) -> None:
        self.sessions = sessions
        self.niceness = niceness  # a rebuild in its own process yields the cores to the questions
        self.max_share, self.clock = max_share, clock
        # Rebuilds that are not forced run in a child process at a lower priority: tokenizing and
        # indexing every chunk holds the GIL for seconds, and the questions' threads share it.
        url = sessions.kw["bind"].url
        self._url = (
            url.render_as_string(hide_password=False)
            if in_child and url.database not in (None, "", ":memory:")
            else None
        )
        # False when BM25's postings live on expert shards (MOERAG_SHARD_MAP): the statistics alone.
        self.postings = postings
        # The central sample's share of the chunks (engine.central_sample), built with each BM25
        # build from the same read (0: none): where questions are routed without the shards.
        self.sample_share = sample
        self.sample: CentralSample | None = None
        self._pool: ProcessPoolExecutor | None = None
        self._index: LexicalIndex | None = None
        self.version = 0  # the catalogue version of the last build (its rows are this version's or later)
        self.builds = 0  # how many times it was (re)built
        self._listeners: list[
            Callable[[LexicalIndex, int, CentralSample | None], object]
        ] = []  # told of each build (the serving state)
        self._dirty = True
        self._next_allowed = 0.0  # clock time before which a non-forced rebuild waits
        self._lock = threading.Lock()

    def current(self) -> LexicalIndex | None:
        return self._index

    def subscribe(self, listener: Callable[[LexicalIndex, int, CentralSample | None], object]) -> None:
        """Tell `listener` of every build from now on: (the index, the catalogue version it read, the
        central sample built with it)."""
        self._listeners.append(listener)

    def mark_dirty(self, *_: object) -> None:
        """Chunks changed (a catalogue subscriber): the next allowed refresh rebuilds."""
        self._dirty = True

    def refresh(self, *, force: bool = False) -> bool:
        """Rebuild if chunks changed since the last build and the spacing allows; searches meanwhile
        use the old index. `force` rebuilds now."""
        if not (self._dirty or force) or (not force and self.clock() < self._next_allowed):
            return False
        with self._lock:
            self._dirty = False
            t0 = self.clock()
            fresh, version, sample = self._build(in_child=not force)
            self._index, self.version, self.sample = fresh, version, sample
            self.builds += 1
            for told in self._listeners:
                told(fresh, version, sample)
            took = self.clock() - t0
            self._next_allowed = t0 + took / self.max_share
        log.info("BM25 index rebuilt over %d chunks in %.1fs", len(fresh), took)
        return True

    def _build(self, *, in_child: bool) -> tuple[LexicalIndex, int, CentralSample | None]:
        if not in_child or self._url is None:
            return build_with_sample(self.sessions, self.postings, self.sample_share)
        if self._pool is None:
            # A fresh interpreter a rebuild (never fork a process that runs threads), gone with it:
            # no memory held between rebuilds, no process left behind by a parent that dies.
            context = multiprocessing.get_context("spawn")
            helpers_die_with_this_process()  # its worker dies with this process from its first import
            self._pool = ProcessPoolExecutor(
                1, context, initializer=_worker_start, initargs=(self.niceness, os.getpid()), max_tasks_per_child=1
            )
        try:
            return self._pool.submit(_build_at, self._url, self.postings, self.sample_share).result()
        except Exception:  # the child died (memory?) or failed: build here, as before
            log.exception("BM25 rebuild in a child process failed; rebuilding in this one")
            self.close()
            return build_with_sample(self.sessions, self.postings, self.sample_share)

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
