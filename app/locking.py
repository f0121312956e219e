"""One process owns a data directory's index at a time (an advisory file lock)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO


class DataDirBusy(RuntimeError):
    pass


class DataDirLock:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / ".lock"
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+", encoding="ascii")  # noqa: SIM115 - held for the process lifetime
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "?"
            f.close()
            raise DataDirBusy(
                f"data directory {self.path.parent} is in use by another moerag process (pid {holder}); "
                "stop it, or send the work to it with --server URL"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self._file = f

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None
