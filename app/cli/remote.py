"""The CLI against a running server: one-line errors, jobs followed with progress.

A server records its address in the data directory's lock file (`app.core.locking`); a command run on
a data directory that a live server holds finds it there and sends the work to it, instead of
failing on the lock (`--server URL` says where explicitly).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from moerag.client import ApiError, Client


class Remote(Client):
    """The Python client (moerag.client) for CLI commands: every failure is a one-line SystemExit
    naming the server (`moerag: http://…/ask answered 404: expert_not_found: …`)."""

    def __enter__(self) -> Remote:
        return self

    def call(self, method: str, path: str, ok: tuple[int, ...] = (200,), **kw: Any) -> Any:
        try:
            return self.request(method, path, ok, **kw)
        except ApiError as exc:
            raise SystemExit(f"moerag: {exc}") from None

    def follow_job(self, job: dict[str, Any], progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
        """Wait for a job, with progress; a failed one is a one-line exit."""
        try:
            return dict(self.wait(job, progress))  # type: ignore[arg-type]
        except ApiError as exc:
            raise SystemExit(f"moerag: {exc}") from None


def print_answer(body: dict[str, Any], as_json: bool) -> None:
    """An /ask response as the CLI shows it (the same for a local and a remote answer)."""
    if as_json:
        print(json.dumps(body))
        return
    route = body["route"]
    who = f"expert {route['expert']['name']!r}" if route["path"] == "expert" and route["expert"] else "fallback"
    print(f"{body['answer']}\n\n[{who}: {route['detail']}]")
    for c in body["citations"]:
        mark = "*" if c.get("used") else " "
        print(f" {mark}[{c['n']}] {c['score']:.3f} {c['source']} :: {c['heading']}")


def snippet(text: str, width: int = 160) -> str:
    """A chunk's text on one line, cut at a word near `width` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[:width].rsplit(" ", 1)[0] + " …"


def print_hits(body: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(body))
        return
    for h in body["hits"]:
        print(f"{h['score']:.3f}  [{h['chunk_id']}] {h['source']} :: {h['heading']}")
        print(f"       {snippet(h['text'])}")
    print(f"({body['vectors_scanned']} vectors in {body['clusters_scanned']} clusters)", file=sys.stderr)


def ingest_remote(
    server: str,
    token: str | None,
    files: list[Path],
    batch: int = 50,
    progress: bool = True,
    sources: list[str] | None = None,
) -> dict[str, int]:
    """Upload through a running server's bulk endpoint and follow its jobs."""
    from tqdm import tqdm

    with Remote(server, token) as api, tqdm(total=len(files), unit="doc", desc="ingest", disable=not progress) as bar:

        def advance(done: int, _total: int) -> None:
            bar.update(done - bar.n)

        try:
            totals = api.upload_many(files, advance, batch, sources=sources)
        except ApiError as exc:
            raise SystemExit(f"moerag: {exc}") from None
    for failure in totals.pop("failures"):
        tqdm.write(f"skipped {failure['source']}: {failure['error']}", file=sys.stderr)
    return totals
