"""A local folder kept in sync with the store: new files ingested, changed ones updated under
their document id, removed ones deleted, unchanged ones skipped by content hash (no embedding).

A folder's documents are those whose source is a path under it (what `moerag ingest FOLDER`
and a sync record: the file's absolute path). A file that fails is reported with its reason and
the run goes on. Files stay inside their root: a symbolic link (to a file or a folder) is skipped
and reported, never followed, and a file is read only if its real path still lies under the root
when it is opened (`read_inside`). The `sync` job (`POST /admin/api/sync`, app.services.bulk) runs it on the
server, which records the result with the job; `moerag sync FOLDER [--every 10m]` runs it here or on that server.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Collection, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.models import Document
from app.services.documents import Ingestor, Upload
from engine.errors import InputError, InvalidRequest, MoeragError, NotConfigured
from engine.parsing import unsupported_reason, walk_documents

Progress = Callable[[int, int], None]


LINKS_LISTED = 100  # a sync names at most this many of the symbolic links it skipped


def allowed_folder(folder: str, roots: str) -> str:
    """The absolute folder a server may sync: inside one of `roots` (MOERAG_SYNC_ROOTS), existing."""
    allowed = [Path(r).expanduser().resolve() for r in roots.split(os.pathsep) if r.strip()]
    if not allowed:
        raise NotConfigured("this server syncs no folder: set MOERAG_SYNC_ROOTS to the folders it may mirror")
    if "\0" in folder:
        raise InvalidRequest("a folder path cannot hold a NUL character")
    path = Path(folder).expanduser()
    if not path.is_absolute():
        raise InvalidRequest(f"{folder!r} is not an absolute path")
    try:
        path = path.resolve()
        is_dir = path.is_dir()
    except OSError as exc:  # a name too long for the file system, a loop of links
        raise InvalidRequest(f"the folder cannot be opened: {exc.strerror or exc}") from None
    if not any(path == r or r in path.parents for r in allowed):
        raise InvalidRequest(f"{path} is outside MOERAG_SYNC_ROOTS")
    if not is_dir:
        raise InvalidRequest(f"{path} is not a folder")
    return str(path)


def inside(path: Path, root: Path) -> bool:
    """Whether `path`'s real location (every link resolved) lies under the real `root`."""
    real, top = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    return real == top or top in real.parents


def folder_files(folder: Path) -> tuple[dict[str, Path], list[str], list[dict[str, str]]]:
    """({absolute path: file} for the files under `folder` that `moerag ingest` would take, the
    symbolic links skipped there as paths relative to `folder`, the files of a type moerag does
    not read: [{path, reason}])."""
    files, links, unsupported = walk_documents(folder)
    skipped = [{"path": p.relative_to(folder).as_posix(), "reason": unsupported_reason(p)} for p in unsupported]
    return {str(p): p for p in files}, [p.relative_to(folder).as_posix() for p in links], skipped


def skipped_links(links: list[str]) -> dict[str, Any]:
    """What a sync reports of the symbolic links it did not follow."""
    return {"links_skipped": len(links), "links": links[:LINKS_LISTED]}


def skipped_files(skipped: list[dict[str, str]]) -> dict[str, Any]:
    """What a sync reports of the files it did not read (their type): a count and the first ones."""
    return {"unsupported_skipped": len(skipped), "unsupported": skipped[:LINKS_LISTED]}


def stored_sources(sessions: Callable[[], Session], prefix: str) -> dict[str, tuple[int, str]]:
    """{source: (document id, content hash)} for the documents whose source starts with `prefix`."""
    with sessions() as s:
        rows = s.execute(
            select(Document.source, Document.id, Document.content_hash).where(
                Document.source.startswith(prefix, autoescape=True)
            )
        ).all()
    return {source: (doc_id, digest) for source, doc_id, digest in rows}


def sync_folder(
    ingestor: Ingestor, sessions: Callable[[], Session], folder: str | Path, progress: Progress | None = None
) -> dict[str, Any]:
    """Mirror `folder` into the store: -> {folder, added, updated, deleted, unchanged, duplicate,
    failed, chunks, failures: [{source, error}]}."""
    root = Path(folder).expanduser().resolve()
    if not root.is_dir():
        raise InvalidRequest(f"{root} is not a folder")
    files, links, unsupported = folder_files(root)
    readers = {source: partial(read_inside, root, path, source) for source, path in files.items()}
    counts = mirror(ingestor, sessions, str(root) + os.sep, readers, progress)
    return {"folder": str(root), **counts, **skipped_links(links), **skipped_files(unsupported)}


def mirror(
    ingestor: Ingestor,
    sessions: Callable[[], Session],
    prefix: str,
    readers: Mapping[str, Callable[[], Upload]],
    progress: Progress | None = None,
    gone: Collection[str] | None = None,
) -> dict[str, Any]:
    """The store's documents under source `prefix` made those of `readers` ({source: its upload,
    read when called; InputError: that one fails}): -> the counts and the failures.

    `gone`: None when `readers` lists the whole source (a folder, a commit), so a stored document
    absent from it is deleted; otherwise the sources that said they are gone (a 404 or 410 page),
    the only ones deleted: the others not read are kept and counted `unvisited`."""
    stored = stored_sources(sessions, prefix)
    counts = dict.fromkeys(("added", "updated", "deleted", "unchanged", "duplicate", "failed", "chunks"), 0)
    failures: list[dict[str, str]] = []
    absent = set(stored) - set(readers)
    deleted = sorted(absent if gone is None else absent & set(gone))
    total, done = len(readers) + len(deleted), 0

    def step() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    def failed(source: str, error: str) -> None:
        counts["failed"] += 1
        failures.append({"source": source, "error": error})

    new = [source for source in readers if source not in stored]
    for source in (s for s in readers if s in stored):
        try:
            counts[_refresh(ingestor, stored[source], readers[source], counts)] += 1
        except MoeragError as exc:
            failed(source, exc.message)
        step()
    for source, outcome in zip(new, ingestor.ingest_many(readers[s] for s in new), strict=True):
        if outcome.error is not None:
            failed(source, outcome.error.message)
        else:
            counts["added" if outcome.status == "created" else "duplicate"] += 1
            counts["chunks"] += outcome.added
        step()
    for source in deleted:
        try:
            ingestor.delete(stored[source][0])
            counts["deleted"] += 1
        except MoeragError as exc:  # deleted meanwhile
            failed(source, exc.message)
        step()
    unvisited = {"unvisited": len(absent) - len(deleted)} if gone is not None else {}
    return {**counts, **unvisited, "failures": failures[:100]}


def _refresh(ingestor: Ingestor, stored: tuple[int, str], read: Callable[[], Upload], counts: dict[str, int]) -> str:
    """A stored document read again: updated under its id when its content changed (its chunks
    counted) -> "updated", else "unchanged"."""
    doc_id, digest = stored
    upload = read()
    if upload.content_hash == digest:
        return "unchanged"
    counts["chunks"] += ingestor.update(doc_id, upload).chunks
    return "updated"


def read_inside(root: Path, path: Path, source: str) -> Upload:
    """The file `path` under `root` as an upload under `source`, read only if it is still a plain
    file under `root` when opened (not a link, not moved behind one since the walk); otherwise, or
    unreadable, an InputError (that file fails, the others go on)."""
    if not inside(path, root):
        raise InputError(f"the file now lies outside {root} (a symbolic link on its way): not read")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise InputError("not a plain file: not read")
            data = f.read()
    except OSError as exc:  # ELOOP: the file became a symbolic link
        raise InputError(f"the file cannot be read: {exc.strerror or exc}") from None
    return Upload(data=data, source=source, filename=path.name)
