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

import builtins
import logging
import uuid
from pathlib import Path

from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

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


class SnapshotStore:
    """Snapshots of the index in one folder, local or at an fsspec URL, through one filesystem API."""

    def __init__(self, folder: Path, url: str | None = None) -> None:
        where = url.rstrip("/") if url else str(folder)
        try:
            self._fs, self._root = url_to_fs(where)
            self._fs.makedirs(self._root, exist_ok=True)
        except (ImportError, ValueError) as exc:  # e.g. s3:// without s3fs installed, an unknown protocol
            raise RuntimeError(f"MOERAG_SNAPSHOT_URL={url!r} cannot be opened: {exc}") from None
        # On a local disk (the default, or file://) a write is fsync'd and renamed into place.
        self._local = isinstance(self._fs, LocalFileSystem)

    def _names(self) -> list[str]:
        self._fs.invalidate_cache(self._root)
        return [str(p).rsplit("/", 1)[-1] for p in self._fs.ls(self._root, detail=False)]

    def list(self, clustering: str) -> list[tuple[int, str]]:
        """(position, location) of a clustering's snapshots, newest last."""
        found = [(pos, f"{self._root}/{n}") for n in self._names() if (pos := position_of(n, clustering)) is not None]
        return sorted(found, key=lambda f: f[0])

    def read(self, location: str) -> bytes:
        """The snapshot's bytes; OSError when it cannot be read (the caller rebuilds from SQL)."""
        data: bytes = self._fs.cat_file(location)
        return data

    def locations(self) -> builtins.list[str]:
        """Every file here (snapshots of the whole index and shard parts, app.shards.parts)."""
        return [f"{self._root}/{n}" for n in self._names()]

    def remove(self, location: str) -> None:
        """Delete a file; one already gone (another process removed it first) is no error."""
        try:
            self._fs.rm_file(location)
        except OSError as exc:
            log.debug("snapshot %s already gone: %s", location, exc)

    def write(self, clustering: str, position: int, data: bytes | memoryview) -> None:
        self.write_named(snapshot_name(clustering, position), data)

    def write_named(self, name: str, data: bytes | memoryview) -> None:
        """Write `data` as `name`, never exposing half a file."""
        if self._local:
            write_atomic(Path(self._root) / name, data)
            return
        partial = f"{self._root}/.{name}.{uuid.uuid4().hex}.partial"
        with self._fs.open(partial, "wb") as f:
            f.write(data)
        self._fs.mv(partial, f"{self._root}/{name}")

    def remove_stale(self, clustering: str) -> None:
        """Keep only the newest snapshot of the live clustering (and no file of an older one)."""
        keep = {loc for _, loc in self.list(clustering)[-1:]}
        for name in self._names():
            where = f"{self._root}/{name}"
            if name.startswith("ivf-") and name.endswith(SUFFIX) and where not in keep:
                self.remove(where)
