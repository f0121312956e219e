"""One process owns a data directory's index at a time (an advisory file lock).

The lock file also says who holds it: the pid, and for `moerag serve` its address, so CLI
commands run on a data directory a server holds can send their work there (`running_server`).
A holder that dies leaves its record behind, but then nobody holds the lock: the record is
read only while the lock is busy, so it is never stale.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from pathlib import Path
from typing import IO, Any

from sqlalchemy import Connection, Engine, text


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
                f"data directory {self.path.parent} is in use by another moerag process (pid {pid}); "
                "stop it, or send the work to it with --server URL"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"pid": os.getpid(), "url": url}))
        f.flush()
        self._file = f

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


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
