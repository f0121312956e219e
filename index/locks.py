"""A readers-writer lock for an index: searches and snapshots read at once, a write is alone."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class ReadWrite:
    """Many readers at once, or one writer; a waiting writer goes before new readers, so writes
    never starve under a steady stream of searches.

    One exception: while a background read is in flight (serializing the index for a snapshot, a
    quarter of a second at 46k vectors) new reads go in even if a writer waits. The writer waits
    for that read anyway, so searches are not held up behind it; once it ends, the writer waits
    at most for the searches already in flight. Not re-entrant for writers; a read inside a read
    only while no writer waits.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._background = 0  # of the readers, how many are background reads
        self._waiting = 0  # writers waiting
        self._writing = False

    @contextmanager
    def read(self, *, background: bool = False) -> Iterator[None]:
        with self._cond:
            while self._writing or (self._waiting and not self._background):
                self._cond.wait()
            self._readers += 1
            self._background += background
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._background -= background
                self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            try:
                while self._writing or self._readers:
                    self._cond.wait()
            finally:
                self._waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()
