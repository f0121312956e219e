"""The CLI against a running server: one-line errors, jobs followed with progress.

A server records its address in the data directory's lock file (`app.locking`); a command run on
a data directory that a live server holds finds it there and sends the work to it, instead of
failing on the lock (`--server URL` says where explicitly).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx


class Remote:
    """A moerag server over HTTP; every failure is a one-line SystemExit naming the server."""

    def __init__(self, url: str, token: str | None) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=300)

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def call(self, method: str, path: str, ok: tuple[int, ...] = (200,), **kw: Any) -> Any:
        try:
            r = self.http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise SystemExit(f"moerag: cannot reach {self.url}: {exc}") from None
        if r.status_code not in ok:
            raise SystemExit(f"moerag: {self.url}{path} answered {r.status_code}: {_error_text(r)}")
        return r.json() if r.content else None

    def follow_job(self, job: dict[str, Any], progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
        """Poll a job until it ends; a failed job is a one-line exit."""
        while job["status"] not in ("done", "failed"):
            time.sleep(0.5)
            job = self.call("GET", f"/jobs/{job['id']}")
            if progress is not None:
                progress(job["done"], job["total"] or 1)
        if job["status"] == "failed":
            raise SystemExit(f"moerag: job {job['id']} ({job['kind']}) failed: {job['error']}")
        return job


def _error_text(r: httpx.Response) -> str:
    try:
        err = r.json()["error"]
        return f"{err['code']}: {err['message']}"
    except (ValueError, KeyError, TypeError):
        return r.text[:300]


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
    server: str, token: str | None, files: list[Path], batch: int = 50, progress: bool = True
) -> dict[str, int]:
    """Upload through a running server's bulk endpoint and follow its jobs."""
    from tqdm import tqdm

    totals = {"created": 0, "duplicate": 0, "failed": 0, "chunks": 0}
    with Remote(server, token) as api, tqdm(total=len(files), unit="doc", desc="ingest", disable=not progress) as bar:
        for start in range(0, len(files), batch):
            part = files[start : start + batch]
            multipart = [("files", (str(f), f.read_bytes())) for f in part]
            job = api.call("POST", "/documents/bulk", ok=(202,), files=multipart)
            seen = 0

            def advance(done: int, total: int) -> None:
                nonlocal seen
                bar.update(done - seen)
                seen = done

            job = api.follow_job(job, advance)
            for key in totals:
                totals[key] += job["result"].get(key, 0)
            for failure in job["result"].get("failures", []):
                tqdm.write(f"skipped {failure['source']}: {failure['error']}", file=sys.stderr)
    return totals
