"""A local folder kept in sync with the store: new files ingested, changed ones updated under
their document id, removed ones deleted, unchanged ones skipped by content hash (no embedding).

A folder's documents are those whose source is a path under it (what `moerag ingest FOLDER`
and a sync record: the file's absolute path). A file that fails is reported with its reason and
the run goes on. The `sync` job (`POST /admin/api/sync`, app.services.bulk) runs it on the
server, which records the result with the job; `moerag sync FOLDER [--every 10m]` runs it here or on that server.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.errors import ApiError
from app.models import Document
from app.services.documents import Ingestor, Upload
from engine.errors import InputError, MoeragError, NotConfigured
from engine.parsing import document_files

Progress = Callable[[int, int], None]


def allowed_folder(folder: str, roots: str) -> str:
    """The absolute folder a server may sync: inside one of `roots` (MOERAG_SYNC_ROOTS), existing."""
    allowed = [Path(r).expanduser().resolve() for r in roots.split(os.pathsep) if r.strip()]
    if not allowed:
        raise NotConfigured("this server syncs no folder: set MOERAG_SYNC_ROOTS to the folders it may mirror")
    path = Path(folder).expanduser()
    if not path.is_absolute():
        raise ApiError("invalid_request", f"{folder!r} is not an absolute path")
    path = path.resolve()
    if not any(path == r or r in path.parents for r in allowed):
        raise ApiError("invalid_request", f"{path} is outside MOERAG_SYNC_ROOTS")
    if not path.is_dir():
        raise ApiError("invalid_request", f"{path} is not a folder")
    return str(path)


def folder_files(folder: Path) -> dict[str, Path]:
    """{absolute path: file} for the files under `folder` that `moerag ingest` would take."""
    return {str(p): p for p in document_files(folder)}


def _stored(sessions: Callable[[], Session], prefix: str) -> dict[str, tuple[int, str]]:
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
        raise ApiError("invalid_request", f"{root} is not a folder")
    readers = {source: partial(read_file, path, source) for source, path in folder_files(root).items()}
    return {"folder": str(root), **mirror(ingestor, sessions, str(root) + os.sep, readers, progress)}


def mirror(
    ingestor: Ingestor,
    sessions: Callable[[], Session],
    prefix: str,
    readers: Mapping[str, Callable[[], Upload]],
    progress: Progress | None = None,
    keep: Collection[str] = (),
) -> dict[str, Any]:
    """The store's documents under source `prefix` made those of `readers` ({source: its upload,
    read when called; InputError: that one fails}), sources in `keep` left as they are even when
    absent: -> the counts and the failures."""
    stored = _stored(sessions, prefix)
    counts = dict.fromkeys(("added", "updated", "deleted", "unchanged", "duplicate", "failed", "chunks"), 0)
    failures: list[dict[str, str]] = []
    gone = sorted(set(stored) - set(readers) - set(keep))
    total, done = len(readers) + len(gone), 0

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
        doc_id, digest = stored[source]
        try:
            upload = readers[source]()
            if upload.content_hash == digest:
                counts["unchanged"] += 1
            else:
                counts["chunks"] += ingestor.update(doc_id, upload).chunks
                counts["updated"] += 1
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
    for source in gone:
        try:
            ingestor.delete(stored[source][0])
            counts["deleted"] += 1
        except MoeragError as exc:  # deleted meanwhile
            failed(source, exc.message)
        step()
    return {**counts, "failures": failures[:100]}


def read_file(path: Path, source: str) -> Upload:
    """A file as an upload under `source`; an unreadable one is an InputError (that file fails)."""
    try:
        return Upload(data=path.read_bytes(), source=source, filename=path.name)
    except OSError as exc:
        raise InputError(f"the file cannot be read: {exc.strerror or exc}") from None
