"""Turns at the embedding model: one encode at a time, urgent callers before background ones.

A large document embeds in slices, each a background turn; a question (`/search`) or a small
upload takes an urgent turn and so waits at most for the slice in progress, never for the
document. One encode at a time is what torch gives anyway (each call uses every thread it has).
Those turns run on one thread at a lower CPU priority (`LowPriority`) in a serving process.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")


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


class LowPriority:
    """One thread, at a lower CPU priority, that runs the model's turns for documents.

    Embedding uploads (and training samples) competes for the cores with the questions being
    answered; at `niceness` 10 the scheduler gives a thread about a tenth of a core against busy
    normal ones, so a question never waits behind an upload's forward pass for the CPU, and an
    upload still uses every core nothing else wants. Per-thread niceness is Linux's; elsewhere,
    or at niceness 0, the work runs in the caller's thread. One thread is enough: turns are one
    at a time anyway. A call made from the thread itself runs inline.
    """

    def __init__(self, niceness: int) -> None:
        """niceness: added to the process's (as `nice`), up to 19."""
        self.niceness = self.effective(niceness)
        self._pool = (
            ThreadPoolExecutor(
                1, thread_name_prefix="moerag-embed", initializer=lower_this_thread, initargs=(self.niceness,)
            )
            if self.niceness
            else None
        )
        self._ident: int | None = None

    @staticmethod
    def effective(niceness: int) -> int:
        """The niceness a LowPriority asked for `niceness` runs at here (0: none, in the caller)."""
        return niceness if niceness > 0 and sys.platform == "linux" else 0

    def run(self, fn: Callable[[], T]) -> T:
        if self._pool is None or threading.get_ident() == self._ident:
            return fn()
        return self._pool.submit(self._mark_then, fn).result()

    def _mark_then(self, fn: Callable[[], T]) -> T:
        self._ident = threading.get_ident()
        return fn()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)


def lower_this_thread(niceness: int) -> None:
    """The calling thread only (Linux: a thread is a task with its own nice value), `niceness`
    below what it has, up to 19; elsewhere, or at 0, nothing."""
    if niceness <= 0 or sys.platform != "linux":
        return
    me = threading.get_native_id()
    os.setpriority(os.PRIO_PROCESS, me, min(os.getpriority(os.PRIO_PROCESS, me) + niceness, 19))
