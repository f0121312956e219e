"""Where index snapshots live: the data directory's index folder by default, or any fsspec URL
(`MOERAG_SNAPSHOT_URL`: `s3://bucket/moerag`, `gs://…`, `file:///shared/moerag`, …) so that
processes on several machines boot from the same snapshots.

A snapshot is named by the clustering it belongs to and the catalogue version (index log
position) it holds: `ivf-<clustering>@<position>.faiss`. Writes never expose half a file: a local
file is written beside and renamed (fsync'd); a remote one is uploaded under a temporary name and
moved, and an object store's single PUT is atomic anyway. SQL stays the truth: a missing or
unreadable snapshot means a rebuild from SQL, never a wrong answer.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

from index.store import write_atomic

log = logging.getLogger(__name__)
SUFFIX = ".faiss"


def snapshot_name(clustering: str, position: int) -> str:
    return f"ivf-{clustering}@{position}{SUFFIX}"


def position_of(name: str, clustering: str) -> int | None:
    """The position a file name holds for this clustering, or None. A file of a version before the
    index log (`ivf-<clustering>.faiss`) counts as position 0: start-up replays the whole log
    after it and checks it against SQL, so an upgrade does not rebuild."""
    if name == f"ivf-{clustering}{SUFFIX}":
        return 0
    prefix = f"ivf-{clustering}@"
    if name.startswith(prefix) and name.endswith(SUFFIX):
        tail = name[len(prefix) : -len(SUFFIX)]
        return int(tail) if tail.isdigit() else None
    return None


def _filesystem(url: str) -> tuple[Any, str]:
    try:
        from fsspec.core import url_to_fs
    except ImportError:  # pragma: no cover - fsspec comes with huggingface-hub
        raise RuntimeError(
            "MOERAG_SNAPSHOT_URL needs fsspec: pip install 'moerag[snapshots]' (plus s3fs or gcsfs for a bucket)"
        ) from None
    try:
        return url_to_fs(url)
    except (ImportError, ValueError) as exc:  # e.g. s3:// without s3fs installed
        raise RuntimeError(f"MOERAG_SNAPSHOT_URL={url!r} cannot be opened: {exc}") from None


class SnapshotStore:
    """Snapshots of the index in one place: a local folder, or a folder at an fsspec URL."""

    def __init__(self, folder: Path, url: str | None = None) -> None:
        self.folder = folder
        self.url = url.rstrip("/") if url else None
        self._fs: Any = None
        self._root = ""
        if self.url:
            self._fs, self._root = _filesystem(self.url)
            self._fs.makedirs(self._root, exist_ok=True)

    def __str__(self) -> str:
        return self.url or str(self.folder)

    def _names(self) -> list[str]:
        if self._fs is None:
            return [p.name for p in self.folder.glob(f"ivf-*{SUFFIX}")] if self.folder.exists() else []
        self._fs.invalidate_cache(self._root)
        return [str(p).rsplit("/", 1)[-1] for p in self._fs.ls(self._root, detail=False)]

    def _where(self, name: str) -> Path | str:
        return self.folder / name if self._fs is None else f"{self._root}/{name}"

    def list(self, clustering: str) -> list[tuple[int, Path | str]]:
        """(position, location) of a clustering's snapshots, newest last."""
        found = [(pos, self._where(n)) for n in self._names() if (pos := position_of(n, clustering)) is not None]
        return sorted(found, key=lambda f: f[0])

    def read(self, location: Path | str) -> bytes:
        """The snapshot's bytes; OSError when it cannot be read (the caller rebuilds from SQL)."""
        if self._fs is None:
            return Path(location).read_bytes()
        with self._fs.open(str(location), "rb") as f:
            data: bytes = f.read()
            return data

    def write(self, clustering: str, position: int, data: bytes) -> None:
        name = snapshot_name(clustering, position)
        if self._fs is None:
            write_atomic(self.folder / name, data)
            return
        partial = f"{self._root}/.{name}.{uuid.uuid4().hex}.partial"
        with self._fs.open(partial, "wb") as f:
            f.write(data)
        self._fs.mv(partial, f"{self._root}/{name}")

    def remove_stale(self, clustering: str) -> None:
        """Keep only the newest snapshot of the live clustering (and no file of an older one)."""
        keep = {str(loc) for _, loc in self.list(clustering)[-1:]}
        for name in self._names():
            where = self._where(name)
            if name.startswith("ivf-") and name.endswith(SUFFIX) and str(where) not in keep:
                try:
                    if self._fs is None:
                        Path(where).unlink(missing_ok=True)
                    else:
                        self._fs.rm(str(where))
                except (OSError, FileNotFoundError) as exc:  # another writer removed it first
                    log.debug("snapshot %s already gone: %s", where, exc)
