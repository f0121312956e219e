"""Where the model's document turns run: one thread at a lower CPU priority (engine.turns.LowPriority)."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from engine.turns import LowPriority


def _niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread niceness is Linux's")
def test_document_turns_run_on_one_lower_priority_thread() -> None:
    mine = _niceness()
    lower = LowPriority(10)
    try:
        seen = [lower.run(lambda: (threading.get_ident(), _niceness())) for _ in range(3)]
        assert {s[0] for s in seen} == {seen[0][0]} != threading.get_ident()  # one thread, not the caller's
        assert seen[0][1] == min(mine + 10, 19)
        assert _niceness() == mine  # the caller keeps its own
        assert lower.run(lambda: lower.run(threading.get_ident)) == seen[0][0]  # from the thread itself: inline
        with pytest.raises(ValueError, match="bad text"):
            lower.run(lambda: (_ for _ in ()).throw(ValueError("bad text")))  # the caller gets the error
    finally:
        lower.close()


def test_niceness_zero_runs_in_the_callers_thread() -> None:
    lower = LowPriority(0)
    assert lower.run(threading.get_ident) == threading.get_ident()
