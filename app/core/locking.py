"""One process owns a data directory's index at a time (an advisory file lock).

The lock file also says who holds it: the pid, and for `moerag serve` its address, so CLI
commands run on a data directory a server holds can send their work there (`running_server`).
A holder that dies leaves its record behind, but then nobody holds the lock: the record is
read only while the lock is busy, so it is never stale.

`moerag serve --workers N` is one server of several processes: the supervisor takes the lock,
writes its record and turns it into a shared one (`share`), and every worker holds it shared too
(`join`), so the data dir stays taken while any process of the server lives. Each worker also
dies with its supervisor (`die_with_parent`): a killed supervisor leaves no orphans serving.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import IO, Any

from sqlalchemy import Connection, Engine, text

from app.core.lifeline import parent_death_signal

log = logging.getLogger(__name__)


class DataDirBusy(RuntimeError):
    pass


class DataDirLock:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / ".lock"
        self._file: IO[str] | None = None

    def acquire(self, url: str | None = None) -> None:
        """Take the lock (DataDirBusy if another process has it) and record the pid and `url`."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+", encoding="ascii")  # noqa: SIM115 - held for the process lifetime
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            pid = _record(f.read()).get("pid", "?")
            f.close()
            raise DataDirBusy(
                f"data directory {self.path.parent} is in use by another moerag process (pid {pid})"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"pid": os.getpid(), "url": url}))
        f.flush()
        self._file = f

    def share(self) -> None:
        """Keep holding the lock, shared with the server's workers (`join`); the record stays."""
        assert self._file is not None, "share() after acquire()"
        try:
            fcntl.flock(self._file, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # flock converts by release + take: a one-shot command got in between
            self.release()
            raise DataDirBusy(f"data directory {self.path.parent} was taken while starting the workers") from None

    def join(self) -> None:
        """Hold the lock shared beside the supervisor that holds it (a `serve --workers N` worker)."""
        f = open(self.path, "a+", encoding="ascii")  # noqa: SIM115 - held for the process lifetime
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise DataDirBusy(f"data directory {self.path.parent} is held by a process outside this server") from None
        self._file = f

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


_WATCH_SECONDS = 0.5


def die_with_parent(parent: int, grace_seconds: float = 3.0) -> None:
    """SIGTERM this process (a graceful stop) when `parent` is gone, SIGKILL it `grace_seconds`
    later if it still lives (a worker still loading its model would finish that first; what a
    kill interrupts, SQL and the index log recover, as after any crash). The kernel sends the
    SIGTERM at once where it can (Linux's PR_SET_PDEATHSIG); a thread watching the parent pid
    covers the rest (a parent already gone before this call, other systems) and the grace."""
    parent_death_signal(signal.SIGTERM)  # not Linux: the watch alone

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_WATCH_SECONDS)
        log.warning("the supervising process %d is gone: this worker stops", parent)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_seconds)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="moerag-parent-watch", daemon=True).start()


def dies_with_caller() -> None:
    """A `preexec_fn` for a short-lived child (git): SIGKILL it when the thread that started it, and
    so this process, is gone. `subprocess.run` holds that thread until the child ends."""
    parent_death_signal(signal.SIGKILL)


def exit_with_parent(parent: int) -> None:
    """Make this helper process (a BM25 rebuild worker) end when `parent` is gone, where the
    kernel's parent-death signal, asked for at its first import (app.core.lifeline), is not to be
    had: a thread watching the parent pid."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_WATCH_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="moerag-parent-watch", daemon=True).start()


def running_server(data_dir: Path) -> str | None:
    """The address of the live server holding `data_dir`, or None (free, or held by a one-shot command)."""
    lock = DataDirLock(data_dir)
    if not lock.path.exists():
        return None
    try:
        lock.acquire()
    except DataDirBusy:
        url = _record(lock.path.read_text(encoding="ascii")).get("url")
        return str(url) if url else None
    lock.release()
    return None


def _record(text: str) -> dict[str, Any]:
    """The holder's record; a bare pid from an older version reads as {"pid": ...}."""
    try:
        record = json.loads(text)
    except ValueError:
        return {"pid": text.strip() or "?"}
    return record if isinstance(record, dict) else {"pid": record}


class SqlLease:
    """One holder among all processes on a database (PostgreSQL: a session advisory lock on a
    connection of its own, released by the server when the holder's connection dies, so a live
    process takes it over at its next try). On SQLite one process owns the data dir: always held."""

    def __init__(self, engine: Engine, key: int) -> None:
        self.engine, self.key = engine, key
        self._conn: Connection | None = None
        self._lock = threading.Lock()

    def held(self) -> bool:
        """Whether this process holds the lease, taking it if it is free."""
        if self.engine.dialect.name != "postgresql":
            return True
        with self._lock:
            if self._conn is not None:
                return True
            conn = self.engine.connect()
            if conn.scalar(text("SELECT pg_try_advisory_lock(:k)"), {"k": self.key}):
                conn.commit()
                self._conn = conn
                return True
            conn.close()
            return False

    def release(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self.key})
                self._conn.commit()
                self._conn.close()
                self._conn = None
