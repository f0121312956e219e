"""Turns at the embedding model: one encode at a time, urgent callers before background ones.

A large document embeds in slices, each a background turn; a question (`/search`) or a small
upload takes an urgent turn and so waits at most for the slice in progress, never for the
document. One encode at a time is what torch gives anyway (each call uses every thread it has).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Turns:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = False
        self._urgent_waiting = 0

    @contextmanager
    def turn(self, *, urgent: bool) -> Iterator[None]:
        """Hold the model; a background turn also waits while any urgent caller waits."""
        with self._cond:
            self._urgent_waiting += urgent
            try:
                while self._busy or (not urgent and self._urgent_waiting):
                    self._cond.wait()
            finally:
                self._urgent_waiting -= urgent
            self._busy = True
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
