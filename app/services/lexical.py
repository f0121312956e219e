"""Keeps the BM25 index in step with SQL: built at start-up, rebuilt after changes (debounced)."""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.models import Chunk
from engine.lexical import LexicalIndex

log = logging.getLogger(__name__)


class LexicalManager:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions
        self._index: LexicalIndex | None = None
        self._dirty = True
        self._lock = threading.Lock()

    def current(self) -> LexicalIndex | None:
        return self._index

    def mark_dirty(self) -> None:
        self._dirty = True

    def refresh(self, *, force: bool = False) -> bool:
        """Rebuild if chunks changed since the last build. Searches meanwhile use the old index."""
        if not (self._dirty or force):
            return False
        with self._lock:
            self._dirty = False
            t0 = time.perf_counter()
            with self.sessions() as s:
                rows = s.execute(select(Chunk.id, Chunk.heading, Chunk.text).order_by(Chunk.id)).all()
            fresh = LexicalIndex([r[0] for r in rows], [f"{r[1]}\n{r[2]}" for r in rows])
            self._index = fresh
        log.info("BM25 index rebuilt over %d chunks in %.1fs", len(fresh), time.perf_counter() - t0)
        return True
