"""Sync stays inside its bounds, as an attacker and an unlucky operator would probe it: symbolic
links out of a git repository or a folder are skipped, URLs are compared as URLs (dot segments,
userinfo, a longer port or host, a redirect out), a page is read within its bytes and its time,
and a slow page holds no other job back."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.core.models import Chunk, Document
from app.runtime import Runtime
from app.services.sync import allowed_folder, sync_folder
from app.services.sync_bounds import Bounds, FetchRefused, PageFetcher, allowed_url
from app.services.sync_sources import sync_site
from engine.errors import InvalidRequest
from tests.conftest import AUTH
from tests.helpers import topic_doc, wait_job
from tests.test_sync_sources import needs_git

SECRET = "moerag-secret-3f9c1b7e"


def _stored_text(rt: Runtime) -> str:
    with rt.sessions() as s:
        return "\n".join(s.scalars(select(Chunk.text))) + "\n".join(s.scalars(select(Document.source)))


def _commit(repo: Path, files: dict[str, str], links: dict[str, str]) -> Path:
    repo.mkdir(parents=True)
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    for name, target in links.items():
        os.symlink(target, repo / name)
    for args in (
        ("init", "-q", "-b", "main"),
        ("add", "-A"),
        ("-c", "user.email=t@example.org", "-c", "user.name=t", "commit", "-qm", "links"),
    ):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
    return repo


@needs_git
def test_a_repository_s_links_out_are_skipped_and_the_admin_token_stays_unread(
    client: TestClient, tmp_path: Path
) -> None:
    """The attack of the report: `token.txt -> ../../admin_token` (the clone lives two folders
    under the data dir), `passwd.txt -> /etc/passwd`, a linked folder; via the admin API."""
    rt: Runtime = client.app.state.runtime  # type: ignore[attr-defined]
    (rt.settings.resolved_data_dir / "admin_token").write_text(SECRET)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "notes.md").write_text(f"# Notes\n\n{SECRET} in a folder outside the repository.\n")
    repo = _commit(
        tmp_path / "repos" / "team",
        {"README.md": topic_doc("git", 1), "build.bin": "\x00\x01 not a document"},
        {"token.txt": "../../admin_token", "passwd.txt": "/etc/passwd", "linked": str(outside)},
    )
    rt.settings.sync_urls = (tmp_path / "repos").as_uri() + "/"
    job = client.post("/admin/api/sync", json={"git": repo.as_uri()}, headers=AUTH)
    assert job.status_code == 202, job.text
    done = wait_job(client, job.json()["id"])
    result = done["result"]
    assert done["status"] == "done" and result["added"] == 1, done
    assert result["links_skipped"] == 3 and set(result["links"]) == {"token.txt", "passwd.txt", "linked"}, result
    assert result["unsupported_skipped"] == 1 and result["unsupported"][0]["path"] == "build.bin", result["unsupported"]
    text = _stored_text(rt)
    assert SECRET not in text and "root:" not in text
    found = client.get("/documents", params={"q": SECRET}, headers=AUTH).json()
    assert found["total"] == 0, found


def test_a_folder_s_links_out_are_skipped_and_bad_folders_are_a_clear_4xx(client: TestClient, tmp_path: Path) -> None:
    runtime: Runtime = client.app.state.runtime  # type: ignore[attr-defined]
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text(f"# Secret\n\n{SECRET}\n")
    root = tmp_path / "shared"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "a.md").write_text(topic_doc("sqlite", 1))
    os.symlink(outside / "secret.md", root / "docs" / "leak.md")
    os.symlink(outside, root / "linked")
    os.mkfifo(root / "docs" / "pipe.md")  # reading it would block the sync forever
    result = sync_folder(runtime.ingestor, runtime.sessions, root)
    assert (result["added"], result["failed"], result["links_skipped"]) == (1, 0, 2), result
    assert set(result["links"]) == {"docs/leak.md", "linked"}
    assert SECRET not in _stored_text(runtime)

    runtime.settings.sync_roots = str(root)  # a link inside the root to a folder outside it
    for folder, why in (
        (str(root) + "\x00x", "NUL"),
        ("/" + "a" * 4095, "cannot be opened"),
        (str(root / "linked"), "outside"),
    ):
        r = client.post("/admin/api/sync", json={"folder": folder}, headers=AUTH)
        assert r.status_code == 422 and why in r.json()["error"]["message"], (folder[:40], r.text)
    with pytest.raises(InvalidRequest, match="NUL"):
        allowed_folder(str(root) + "\x00", str(tmp_path))


@pytest.mark.parametrize(
    ("url", "prefix", "outcome"),
    [
        ("http://127.0.0.1:8410/docs/a.html", "http://127.0.0.1:8410/docs/", "http://127.0.0.1:8410/docs/a.html"),
        ("HTTP://127.0.0.1:8410/docs/./b/../a.html", "http://127.0.0.1:8410/docs", "http://127.0.0.1:8410/docs/a.html"),
        ("http://127.0.0.1:8410/docs/../secret.html", "http://127.0.0.1:8410/docs/", "outside"),
        ("http://127.0.0.1:8410/docs/%2e%2E/secret.html", "http://127.0.0.1:8410/docs/", "outside"),
        ("http://127.0.0.1:8410/docs/..%2fsecret.html", "http://127.0.0.1:8410/docs/", "encoded slash"),
        ("http://127.0.0.1:8410@127.0.0.1:8411/docs/", "http://127.0.0.1:8410", "credentials"),
        ("http://user@127.0.0.1:8410/docs/", "http://127.0.0.1:8410", "credentials"),
        ("http://127.0.0.1:84100/", "http://127.0.0.1:8410", "not a URL"),
        ("http://127.0.0.1:8410/", "http://127.0.0.1:841", "outside"),
        ("http://127.0.0.1:8410/docsx/a.html", "http://127.0.0.1:8410/docs", "outside"),
        ("https://docs.example.com.evil.net/", "https://docs.example.com", "outside"),
        ("https://DOCS.example.com:443/x", "https://docs.example.com", "https://docs.example.com/x"),
        ("http://docs.example.com:443/x", "https://docs.example.com", "outside"),
        ("git@github.com:org/repo.git", "git@github.com:org/", "ssh://git@github.com/org/repo.git"),
        ("ssh://git@github.com/org/repo.git", "git@github.com:org", "ssh://git@github.com/org/repo.git"),
        ("evil@github.com:org/repo.git", "git@github.com:org/", "outside"),
        ("git@github.com:other/repo.git", "git@github.com:org/", "outside"),
        ("ext::sh -c evil", "git@github.com:org/", "spaces"),
        ("ftp://127.0.0.1/docs/", "ftp://127.0.0.1/", "not an http"),
    ],
)
def test_urls_are_compared_as_urls(url: str, prefix: str, outcome: str) -> None:
    if outcome.startswith(("http", "ssh")):
        assert allowed_url(url, prefix) == outcome
    else:
        with pytest.raises(InvalidRequest, match=outcome):
            allowed_url(url, prefix)


def test_a_file_url_is_compared_by_its_real_path(tmp_path: Path) -> None:
    allowed, outside = tmp_path / "allowed", tmp_path / "outside" / "repo"
    allowed.mkdir()
    outside.mkdir(parents=True)
    os.symlink(outside, allowed / "link")
    prefix = allowed.as_uri() + "/"
    assert allowed_url(allowed.as_uri() + "/repo", prefix) == allowed.as_uri() + "/repo"
    for url in (f"{allowed.as_uri()}/../outside/repo", f"{allowed.as_uri()}/link"):
        with pytest.raises(InvalidRequest, match="outside MOERAG_SYNC_URLS"):
            allowed_url(url, prefix)


Route = Callable[[BaseHTTPRequestHandler], None]


class _Site:
    """A local HTTP server of routes ({path: handler}) that counts the requests it was sent."""

    def __init__(self, routes: dict[str, Route]) -> None:
        site = self
        self.routes, self.requests = routes, []

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                site.requests.append(self.path)
                route = site.routes.get(self.path.split("?")[0])
                if route is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    route(self)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def page(html: str) -> Route:
    def send(h: BaseHTTPRequestHandler) -> None:
        body = f"<html><body>{html}</body></html>".encode()
        h.send_response(200)
        h.send_header("Content-Type", "text/html")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    return send


def redirect(location: str) -> Route:
    def send(h: BaseHTTPRequestHandler) -> None:
        h.send_response(302)
        h.send_header("Location", location)
        h.send_header("Content-Length", "0")
        h.end_headers()

    return send


def streamed(total: int, chunk: int = 64 * 1024, pause: float = 0.0) -> Route:
    """A chunked body of `total` bytes (no Content-Length), `chunk` bytes every `pause` seconds."""

    def send(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/html")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        block, sent = b"<p>" + b"x" * (chunk - 3), 0
        while sent < total:
            piece = block[: min(chunk, total - sent)]
            h.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            h.wfile.flush()
            sent += len(piece)
            if pause:
                time.sleep(pause)
        h.wfile.write(b"0\r\n\r\n")

    return send


@pytest.fixture
def two_sites() -> Iterator[tuple[_Site, _Site]]:
    """An allowed site and a second local server outside the bounds, with a secret page."""
    other = _Site({"/secret.html": page(f"<h1>Secret</h1><p>{SECRET}</p>")})
    allowed = _Site({})
    allowed.routes |= {
        "/docs/index.html": page(
            f'<h1>Docs</h1><p>{topic_doc("git", 1)}</p><a href="out.html">out</a> <a href="hop.html">hop</a>'
            f' <a href="{other.url}/secret.html">abs</a> <a href="../secret.html">up</a>'
        ),
        "/docs/out.html": redirect(f"{other.url}/secret.html"),  # a redirect out of the prefix
        "/docs/hop.html": redirect("/docs/wal.html"),  # a redirect inside it: followed
        "/docs/wal.html": page(f"<h1>WAL</h1><p>{topic_doc('sqlite', 2)}</p>"),
        "/secret.html": page(f"<h1>Secret</h1><p>{SECRET}</p>"),  # on the allowed host, outside /docs/
        "/robots.txt": page(""),
    }
    try:
        yield allowed, other
    finally:
        allowed.close()
        other.close()


def test_a_site_sync_fetches_nothing_outside_its_bounds(two_sites: tuple[_Site, _Site], runtime: Runtime) -> None:
    allowed, other = two_sites
    bounds = Bounds.of(f"{allowed.url}/docs/")
    result = sync_site(runtime.ingestor, runtime.sessions, f"{allowed.url}/docs/index.html", bounds=bounds)
    assert (result["pages"], result["added"]) == (2, 2), result  # index, and wal through the hop
    refused = [f for f in result["failures"] if f["source"].endswith("/docs/out.html")]
    assert refused and "not followed" in refused[0]["error"] and "outside MOERAG_SYNC_URLS" in refused[0]["error"]
    assert other.requests == [] and "/secret.html" not in allowed.requests
    assert SECRET not in _stored_text(runtime)


def test_the_api_refuses_the_four_url_tricks(two_sites: tuple[_Site, _Site], client: TestClient) -> None:
    allowed, other = two_sites
    rt: Runtime = client.app.state.runtime  # type: ignore[attr-defined]
    port = allowed.url.rsplit(":", 1)[1]
    rt.settings.sync_urls = f"{allowed.url}/docs {other.url[:-1]}"  # the other's port, a digit short
    tricks = [
        f"{allowed.url}/docs/../secret.html",  # dot segments
        f"{allowed.url}/docs/%2e%2e/secret.html",
        f"http://127.0.0.1:{port}@{other.url.removeprefix('http://')}/secret.html",  # userinfo
        f"{other.url}/secret.html",  # a longer port: the prefix's port is a digit short of the other's
        f"http://127.0.0.1.evil.net:{port}/docs/index.html",  # a longer host
    ]
    for url in tricks:
        for kind in ("site", "git"):
            r = client.post("/admin/api/sync", json={kind: url}, headers=AUTH)
            assert r.status_code == 422, (url, r.text)
    assert other.requests == [] and allowed.requests == []


def test_a_huge_page_is_refused_as_it_streams() -> None:
    site = _Site({"/docs/huge.html": streamed(300 * 1024 * 1024)})
    try:
        with httpx.Client() as http:
            get = PageFetcher(http, Bounds.of(site.url), max_bytes=20 * 1024 * 1024, seconds=60)
            tracemalloc.start()
            try:
                with pytest.raises(FetchRefused, match="larger than"):
                    get(f"{site.url}/docs/huge.html")
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
        assert peak < 50 * 1024 * 1024, f"{peak / 2**20:.0f} MiB held while reading"
    finally:
        site.close()


def test_a_trickling_page_is_cut_and_holds_no_upload_back(client: TestClient) -> None:
    site = _Site({"/docs/slow.html": streamed(10_000, chunk=1, pause=1.0)})
    rt: Runtime = client.app.state.runtime  # type: ignore[attr-defined]
    rt.settings.sync_urls, rt.settings.sync_page_seconds = site.url, 6.0
    try:
        started = time.monotonic()
        sync = client.post("/admin/api/sync", json={"site": f"{site.url}/docs/slow.html"}, headers=AUTH)
        assert sync.status_code == 202, sync.text
        time.sleep(0.5)  # the sync is reading the page
        files = [("files", (f"{t}.md", topic_doc(t, 3).encode(), "text/markdown")) for t in ("git", "debian")]
        ingest = client.post("/documents/bulk", files=files, headers=AUTH)
        assert ingest.status_code == 202, ingest.text
        done = wait_job(client, ingest.json()["id"])
        ingested_after = time.monotonic() - started
        assert done["status"] == "done" and done["result"]["created"] == 2, done
        assert ingested_after < 5.0, f"the upload waited {ingested_after:.1f} s behind the sync"
        cut: Any = wait_job(client, sync.json()["id"], timeout=60)
        took = time.monotonic() - started
        assert cut["status"] == "failed" and "took over 6 s" in cut["error"], cut  # its only page was cut
        assert 6.0 <= took < 15.0, took
    finally:
        site.close()
