"""`moerag serve`: one process, or N uvicorn workers on PostgreSQL under a supervisor."""

from __future__ import annotations

import argparse
import os

from app.cli.common import settings_from
from app.core.settings import Settings


def cmd_serve(args: argparse.Namespace) -> None:
    import uvicorn

    from app.api.connections import uvicorn_options
    from app.api.main import create_app

    settings = settings_from(args)
    url = f"http://{args.host}:{args.port}"
    if args.workers > 1:
        _serve_workers(args, settings, url)
        return
    # The sample is prepared behind an open port: /readyz says "preparing", then "starting".
    from app.cli.sample import ensure_sample

    prepare = (lambda: ensure_sample(settings)) if args.sample else None
    app = create_app(settings, prepare=prepare)
    app.state.runtime.announce_url = url
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=settings.log_level.lower(),
        access_log=settings.access_log,
        **settings.uvicorn_proxy_options(),
        **uvicorn_options(settings),
    )


def _serve_workers(args: argparse.Namespace, settings: Settings, url: str) -> None:
    """N uvicorn worker processes on one port, each a full runtime following the catalogue; this
    process supervises them and holds the data dir (its lock names this address for the CLI)."""
    import uvicorn

    from app.api.connections import uvicorn_options
    from app.core.locking import DataDirBusy, DataDirLock

    if settings.db_url.startswith("sqlite"):
        raise SystemExit(
            "moerag: several workers need PostgreSQL: set MOERAG_DATABASE_URL=postgresql+psycopg://USER:PASS@HOST/DB "
            "(SQLite serves from one process)"
        )
    if args.sample:
        from app.cli.sample import ensure_sample

        ensure_sample(settings)  # before the workers start: they would all try at once
    lock = DataDirLock(settings.resolved_data_dir)
    try:
        lock.acquire(url)
        lock.share()  # held with the workers: taken while any process of this server lives
    except DataDirBusy as exc:
        raise SystemExit(f"moerag: {exc}; stop it first") from None
    from app.core.auth import load_or_create_token

    load_or_create_token(  # one token for every worker, printed once
        settings.admin_token.get_secret_value() if settings.admin_token else None, settings.token_file
    )
    os.environ["MOERAG_DATA_DIR"] = str(settings.data_dir)
    os.environ["MOERAG_WORKER_OF"] = str(os.getpid())
    try:
        uvicorn.run(
            "app.api.worker:app",
            factory=True,
            workers=args.workers,
            host=args.host,
            port=args.port,
            log_level=settings.log_level.lower(),
            access_log=settings.access_log,
            **settings.uvicorn_proxy_options(),
            **uvicorn_options(settings),
        )
    finally:
        lock.release()
