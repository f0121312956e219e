"""A helper process's life bound to its parent's from its first import of `app`.

A BM25 rebuild worker (app.serving.lexical) is a spawned interpreter: before its pool initializer
runs, it imports SQLAlchemy, the engine and the catalogue, seconds at its low priority on busy
cores. A server SIGKILLed meanwhile left it running. `app/__init__.py` calls `bind_to_parent`
first thing, before anything heavy: in a process whose parent named itself in MOERAG_HELPER_OF
(`helpers_die_with_this_process`), it asks the kernel for SIGKILL when that parent dies (Linux's
PR_SET_PDEATHSIG), and exits at once if it already has. This module imports nothing heavy.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

HELPER_OF = "MOERAG_HELPER_OF"  # the pid of the process whose helpers die with it
_PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[[int, int], int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None


_PRCTL = _prctl()  # looked up once, before any fork: a child between fork and exec only calls it


def parent_death_signal(sig: int) -> bool:
    """Ask the kernel to send `sig` to this process when the thread that started it ends (Linux's
    PR_SET_PDEATHSIG); False where there is no such thing. Safe in a `preexec_fn`."""
    if _PRCTL is None:
        return False
    _PRCTL(_PR_SET_PDEATHSIG, sig)
    return True


def helpers_die_with_this_process() -> None:
    """Name this process in the environment its helpers inherit (set before starting them)."""
    os.environ[HELPER_OF] = str(os.getpid())


def bind_to_parent() -> None:
    """SIGKILL this process when its parent dies, if the parent named itself (`HELPER_OF`); its
    other children, and processes started by anyone else, are left as they are."""
    named = os.environ.get(HELPER_OF, "")
    if not named.isdigit():
        return
    parent = int(named)
    if os.getppid() != parent:
        if not _alive(parent):  # its parent died before this process got here: an orphan
            os._exit(1)
        return  # a grandchild, or another process's child: not a helper of `parent`
    if not parent_death_signal(signal.SIGKILL):  # not Linux: the pool initializer's watch alone
        return
    if os.getppid() != parent:  # it died before the signal was asked for
        os._exit(1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True
