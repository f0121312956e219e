"""`moerag db`: migrations, and copying the whole catalogue into another database."""

from __future__ import annotations

import argparse
import json
import sys

from app.cli.common import settings_from


def cmd_db(args: argparse.Namespace) -> None:
    from app.core.db import make_engine
    from app.core.migrate import downgrade, upgrade

    settings = settings_from(args)
    settings.resolved_data_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.db_url)
    if args.action == "copy-to":
        from app.services.dbcopy import TargetNotEmpty, copy_database

        if not args.revision:
            raise SystemExit("moerag: db copy-to needs the target's URL, e.g. postgresql+psycopg://USER:PASS@HOST/DB")
        from app.core.locking import DataDirBusy, DataDirLock

        lock = DataDirLock(settings.resolved_data_dir)  # nothing writes the source while it is copied
        try:
            lock.acquire()
        except DataDirBusy as exc:
            raise SystemExit(f"moerag: {exc}; stop it first") from None
        target = make_engine(args.revision)
        try:
            upgrade(engine)
            counts = copy_database(engine, target, _copy_progress)
        except TargetNotEmpty as exc:
            raise SystemExit(f"moerag: {exc}") from None
        finally:
            target.dispose()
            lock.release()
        print(json.dumps(counts))
        print("copied; serve from it with MOERAG_DATABASE_URL=<the target> (the index is rebuilt from it)")
        return
    if args.action == "upgrade":
        upgrade(engine, args.revision or "head")
    else:
        downgrade(engine, args.revision or "-1")
    engine.dispose()
    print(f"database {args.action}d to {args.revision or ('head' if args.action == 'upgrade' else '-1')}")


def _copy_progress(table: str, done: int, total: int) -> None:
    if done == total or done % 20_000 == 0:
        print(f"{table}: {done}/{total}", file=sys.stderr, flush=True)
