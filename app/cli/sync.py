"""`moerag sync FOLDER|--git URL|--site URL [--every 10m]`: a folder, a git repository or a web
site mirrored into the store, here or on its server."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from app.cli.common import local_runtime, server_for, settings_from, token_for
from app.core.settings import Settings

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def every_seconds(text: str) -> float:
    """'90s', '10m', '2h', '1d' (or bare seconds) -> seconds; at least one second."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    seconds = float(found.group(1)) * _UNITS[found.group(2) or "s"] if found else 0.0
    if seconds < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a period such as 30s, 10m, 2h or 1d")
    return seconds


def cmd_sync(args: argparse.Namespace) -> None:
    settings = settings_from(args)
    if sum(x is not None for x in (args.folder, args.git, args.site)) != 1:
        raise SystemExit("moerag: give one source: a FOLDER, --git URL or --site URL")
    if args.max_pages < 1 or args.max_depth < 0:
        raise SystemExit("moerag: --max-pages takes a positive count, --max-depth zero or more")
    source: dict[str, Any] = {"git": args.git, "branch": args.branch} if args.git else {}
    if args.site:
        source = {"site": args.site, "max_pages": args.max_pages, "max_depth": args.max_depth}
    if args.folder is not None:
        folder = Path(args.folder).expanduser().resolve()
        if not folder.is_dir():
            raise SystemExit(f"moerag: {folder}: no such folder")
        source = {"folder": str(folder)}
    while True:
        result = _sync_once(args, settings, source)
        failures = result.pop("failures", [])
        for failure in failures:
            print(f"failed {failure['source']}: {failure['error']}", file=sys.stderr)
        print(json.dumps(result))
        if args.every is None:
            if result["failed"]:
                raise SystemExit(1)  # the counts are printed; the status says not everything went in
            return
        time.sleep(args.every)


def _sync_once(args: argparse.Namespace, settings: Settings, source: dict[str, Any]) -> dict[str, Any]:
    from tqdm import tqdm

    with tqdm(unit="file", desc="sync", disable=args.quiet) as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        if server := server_for(args, settings):
            from app.cli.remote import Remote

            with Remote(server, token_for(args, settings, admin=True)) as api:
                job = api.call("POST", "/admin/api/sync", ok=(202,), json=source)
                return dict(api.follow_job(job, progress)["result"])
        from app.core import jobs
        from app.services.sync import sync_folder
        from app.services.sync_sources import FetchLimits, sync_git, sync_site
        from engine.errors import MoeragError

        with local_runtime(settings) as rt:
            try:
                if "git" in source:
                    cache = settings.resolved_data_dir / "sources"
                    result = sync_git(rt.ingestor, rt.sessions, source["git"], source["branch"], cache, progress)
                elif "site" in source:
                    pages, depth = source["max_pages"], source["max_depth"]
                    limits = FetchLimits.of(settings)
                    result = sync_site(rt.ingestor, rt.sessions, source["site"], pages, progress, depth, limits=limits)
                else:
                    result = sync_folder(rt.ingestor, rt.sessions, source["folder"], progress)
            except MoeragError as exc:
                jobs.record(rt.sessions, "sync", source, None, f"{type(exc).__name__}: {exc.message}")
                raise SystemExit(f"moerag: {exc.code}: {exc.message}") from None
            jobs.record(rt.sessions, "sync", source, result)  # listed with the server's jobs
            return result
