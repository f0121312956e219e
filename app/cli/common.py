"""What every `moerag` command shares: its settings, a local runtime, where its work goes, its token."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from app.core.settings import Settings

if TYPE_CHECKING:
    from app.runtime import Runtime


def settings_from(args: argparse.Namespace) -> Settings:
    if getattr(args, "data_dir", None):
        return Settings(data_dir=Path(args.data_dir))
    return Settings()


@contextmanager
def local_runtime(settings: Settings, *, remote: bool = True, busy: str | None = None) -> Iterator[Runtime]:
    """A started runtime for one command, closed when it ends (a busy data dir is a clear exit).

    remote: the command has --server, so a busy data dir's message may point there; `busy`: the
    advice instead."""
    from app.core.locking import DataDirBusy
    from app.runtime import Runtime

    rt = Runtime(settings)
    try:
        rt.start(run_jobs=False)  # jobs are the server's: a one-shot command neither resumes nor abandons them
    except DataDirBusy as exc:
        advice = busy or ("stop it, or send the work to it with --server URL" if remote else "stop it first")
        raise SystemExit(f"moerag: {exc}; {advice}") from None
    try:
        yield rt
    finally:
        rt.close()


def require_store(settings: Settings) -> None:
    """A read command (ask, search) on a data dir with no store says so; it created an empty
    store and answered "No passages" before."""
    if settings.database_url is None and not (settings.resolved_data_dir / "moerag.db").exists():
        raise SystemExit(
            f"moerag: no store in {settings.resolved_data_dir}: ingest documents first "
            "(moerag --data-dir DIR ingest PATH...), or point --data-dir (or MOERAG_DATA_DIR) at a store"
        )


def server_for(args: argparse.Namespace, settings: Settings) -> str | None:
    """Where the work goes: --server, else the live server holding the data dir, else None (local)."""
    if getattr(args, "server", None):
        return str(args.server)
    from app.core.locking import running_server

    url = running_server(settings.resolved_data_dir)
    if url is not None:
        print(f"moerag: {settings.resolved_data_dir} is served by {url}; sending the work there", file=sys.stderr)
    return url


def token_for(args: argparse.Namespace, settings: Settings, *, admin: bool) -> str | None:
    """--token, else $MOERAG_ADMIN_TOKEN ($MOERAG_READ_TOKEN for reads), else the data dir's token file.

    None only for a read: a server without a read token answers reads without one.
    """
    explicit = getattr(args, "token", None) or os.environ.get("MOERAG_ADMIN_TOKEN")
    if not explicit and not admin:
        explicit = os.environ.get("MOERAG_READ_TOKEN")
    if explicit:
        return str(explicit)
    try:
        return settings.token_file.read_text(encoding="ascii").strip()
    except OSError:
        if admin:
            raise SystemExit("moerag: no admin token: pass --token or set MOERAG_ADMIN_TOKEN") from None
        return None


def ingest_files(
    rt: Runtime,
    files: list[Path],
    progress: bool = True,
    root: Path | None = None,
    sources: list[str] | None = None,
) -> dict[str, int]:
    """Ingest local files through a started runtime, with a progress bar; failures are listed, not fatal.

    A document's source is `sources`' (`moerag ingest`: app.cli.main.collect), else its path as
    given, or relative to `root` (files the server placed itself, like the sample corpus: no
    server path reaches the API).
    """
    from tqdm import tqdm

    from app.services.documents import Upload

    counts = {"created": 0, "duplicate": 0, "failed": 0, "chunks": 0}

    def read(f: Path, source: str) -> Upload:
        return Upload(data=f.read_bytes(), source=source, filename=f.name)

    def thunks() -> Iterator[Callable[[], Upload]]:
        for n, f in enumerate(files):
            yield partial(read, f, sources[n] if sources is not None else str(f.relative_to(root) if root else f))

    bar = tqdm(total=len(files), unit="doc", disable=not progress, desc="ingest")
    for f, outcome in zip(files, rt.ingestor.ingest_many(thunks()), strict=True):
        counts[outcome.status] += 1
        counts["chunks"] += outcome.added
        if outcome.error is not None:
            tqdm.write(f"skipped {f}: {outcome.error.message}", file=sys.stderr)
        bar.update(1)
        bar.set_postfix(chunks=counts["chunks"])
    bar.close()
    return counts
