"""Bulk ingestion: uploads are spooled to disk first, then ingested by a resumable job."""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.core.jobs import JobContext
from app.core.models import Job
from app.core.settings import Settings
from app.services.documents import Ingestor, Upload
from app.services.sync import sync_folder
from app.services.tokens import Scope
from engine.errors import EmptyDocument

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def clean_spool(sessions: sessionmaker[Session], root: Path) -> None:
    """Spool folders that no unfinished job refers to are leftovers of a crash mid-upload."""
    if not root.exists():
        return
    with sessions() as s:
        unfinished = s.scalars(select(Job).where(Job.status.in_(("queued", "running"))))
        live = {str(j.params.get("spool")) for j in unfinished}
    for folder in root.iterdir():
        if str(folder) not in live:
            shutil.rmtree(folder, ignore_errors=True)


def new_spool(spool_root: Path) -> Path:
    path = spool_root / uuid.uuid4().hex
    path.mkdir(parents=True)
    return path


def spool_file(spool: Path, position: int, filename: str, data: bytes) -> Path:
    """Write one upload durably, so an accepted bulk request loses nothing on a crash."""
    path = spool / f"{position:06d}-{_SAFE.sub('_', filename)[-100:] or 'upload'}"
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return path


def bulk_handler(ingestor: Ingestor) -> Callable[[JobContext], dict[str, Any]]:
    def run(ctx: JobContext) -> dict[str, Any]:
        files: list[dict[str, Any]] = ctx.params["files"]
        total = len(files)
        # A resumed job starts after the last file it recorded, with the counts it had: files
        # ingested after that report (under half a second's worth) count again, as duplicates.
        start = int(ctx.resumed.get("next", 0))
        counts = {"created": 0, "duplicate": 0, "failed": 0, "chunks": 0} | ctx.resumed.get("counts", {})
        failures: list[dict[str, str]] = list(ctx.resumed.get("failures", []))
        scope = Scope.of(ctx.params["scope"]) if ctx.params.get("scope") else None  # a write token's

        def thunks() -> Iterator[Callable[[], Upload]]:
            for f in files[start:]:
                yield partial(_read, f)

        def state(done: int) -> dict[str, Any]:
            return {"next": done, "counts": counts, "failures": failures[:100]}

        ctx.progress(start, total, force=True, state=state(start))
        for done, outcome in enumerate(ingestor.ingest_many(thunks()), start=start + 1):
            error = outcome.error or ingestor.stored_outside(outcome, scope)
            status = "failed" if error is not None else outcome.status
            counts[status] = counts.get(status, 0) + 1
            counts["chunks"] += outcome.added
            if error is not None:
                failures.append({"source": files[done - 1]["source"], "error": error.message})
            ctx.progress(done, total, state=state(done))
        ctx.progress(total, total, force=True)
        spool = ctx.params.get("spool")
        if spool:
            shutil.rmtree(spool, ignore_errors=True)
        return {**counts, "failures": failures[:100]}

    return run


def _read(f: dict[str, Any]) -> Upload:
    try:
        data = Path(f["path"]).read_bytes()
    except OSError as exc:
        raise EmptyDocument(f"cannot read {f['source']}: {exc.strerror}") from exc
    return Upload(
        data=data,
        source=f["source"],
        filename=f.get("filename"),
        title=f.get("title"),
        content_type=f.get("content_type"),
        metadata=f.get("metadata") or {},
    )


def sync_handler(ingestor: Ingestor, cache: Path, settings: Settings) -> Callable[[JobContext], dict[str, Any]]:
    """The `sync` job: params {"folder"}, {"git", "branch"} or {"site", "max_pages", "max_depth"}
    (app.services.sync, sync_sources; git clones kept in `cache`; URLs, redirects included, within
    MOERAG_SYNC_URLS); an interrupted one runs whole again when resumed (a sync is idempotent: what
    it did already is unchanged the second time)."""

    def run(ctx: JobContext) -> dict[str, Any]:
        from app.services.sync_bounds import Bounds
        from app.services.sync_sources import FetchLimits, sync_git, sync_site

        p, progress = ctx.params, (lambda d, t: ctx.progress(d, t))
        bounds = Bounds.of(settings.sync_urls)  # none set: every URL refused
        if p.get("git"):
            return sync_git(ingestor, ingestor.sessions, p["git"], p.get("branch"), cache, progress, bounds)
        if p.get("site"):
            pages, depth = int(p.get("max_pages") or 200), int(p.get("max_depth", 5))
            limits = FetchLimits.of(settings)
            return sync_site(
                ingestor, ingestor.sessions, p["site"], pages, progress, depth, bounds=bounds, limits=limits
            )
        return sync_folder(ingestor, ingestor.sessions, p["folder"], progress)

    return run
