"""Git and web-site sync: a local repository (file://, the real `git` command) and a local HTTP
server mirrored into the store, then changed; only the changes move; the server fetches only
under MOERAG_SYNC_URLS."""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.core.models import Document
from app.runtime import Runtime
from app.services.sync_sources import AGENT, robots, sync_git, sync_site
from engine.errors import SourceUnavailable
from tests.conftest import AUTH
from tests.helpers import topic_doc, wait_job

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")


def _sources(rt: Runtime, prefix: str) -> dict[str, int]:
    with rt.sessions() as s:
        return {src: i for src, i in s.execute(select(Document.source, Document.id)) if src.startswith(prefix)}


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@needs_git
def test_a_git_repository_is_mirrored_and_followed(tmp_path: Path, runtime: Runtime) -> None:
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "t@example.org")
    _git(repo, "config", "user.name", "t")
    (repo / "README.md").write_text(topic_doc("git", 1))
    (repo / "docs" / "wal.md").write_text(topic_doc("sqlite", 2))
    (repo / "docs" / "apt.md").write_text(topic_doc("debian", 3))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "first")
    url, cache = repo.as_uri(), tmp_path / "cache"

    first = sync_git(runtime.ingestor, runtime.sessions, url, "main", cache)
    assert (first["added"], first["failed"]) == (3, 0), first
    before = _sources(runtime, url + "/")
    assert set(before) == {f"{url}/README.md", f"{url}/docs/wal.md", f"{url}/docs/apt.md"}

    (repo / "docs" / "wal.md").write_text(topic_doc("sqlite", 22))
    (repo / "docs" / "apt.md").unlink()
    (repo / "docs" / "py.md").write_text(topic_doc("python", 4))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "second")
    second = sync_git(runtime.ingestor, runtime.sessions, url, "main", cache)
    counts = {k: second[k] for k in ("added", "updated", "deleted", "unchanged", "failed")}
    assert counts == {"added": 1, "updated": 1, "deleted": 1, "unchanged": 1, "failed": 0}, second
    after = _sources(runtime, url + "/")
    assert after[f"{url}/docs/wal.md"] == before[f"{url}/docs/wal.md"]  # updated under its id
    assert f"{url}/docs/apt.md" not in after and f"{url}/docs/py.md" in after


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    root = tmp_path / "www"
    (root / "guide").mkdir(parents=True)
    (root / "blog").mkdir()
    pages = {
        "guide/index.html": '<h1>Guide</h1><p>{}</p><a href="wal.html">WAL</a> <a href="/blog/post.html">blog</a>'
        ' <a href="apt.html#top">apt</a> <a href="missing.html">gone</a>',
        "guide/wal.html": '<h1>WAL</h1><p>{}</p><a href="index.html">back</a>',
        "guide/apt.html": "<h1>apt</h1><p>{}</p>",
        "blog/post.html": "<h1>Post</h1><p>{}</p>",
    }
    for (name, html), topic in zip(pages.items(), ("git", "sqlite", "debian", "python"), strict=True):
        (root / name).write_text(f"<html><body>{html.format(topic_doc(topic, 5))}</body></html>")
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/guide/index.html", root
    finally:
        server.shutdown()
        server.server_close()


def test_a_site_is_crawled_within_its_folder_and_followed(site: tuple[str, Path], runtime: Runtime) -> None:
    start, root = site
    scope = start.rsplit("/", 1)[0] + "/"
    first = sync_site(runtime.ingestor, runtime.sessions, start)
    assert first["pages"] == 3 and first["added"] == 3, first  # the blog is outside the guide's folder
    assert first["failed"] == 1 and first["failures"][0]["source"].endswith("/guide/missing.html")
    assert set(_sources(runtime, scope)) == {scope + "index.html", scope + "wal.html", scope + "apt.html"}

    (root / "guide" / "wal.html").write_text(f"<h1>WAL</h1><p>{topic_doc('sqlite', 9)}</p>")  # no link back
    second = sync_site(runtime.ingestor, runtime.sessions, start)
    counts = {k: second[k] for k in ("added", "updated", "unchanged", "deleted")}
    assert counts == {"added": 0, "updated": 1, "unchanged": 2, "deleted": 0}, second
    (root / "guide" / "index.html").write_text("<h1>Guide</h1><p>only this page now</p>")
    third = sync_site(runtime.ingestor, runtime.sessions, start)  # pages no longer linked are visited
    assert (third["updated"], third["unchanged"], third["deleted"]) == (1, 2, 0), third
    assert set(_sources(runtime, scope)) == {scope + "index.html", scope + "wal.html", scope + "apt.html"}

    cut = sync_site(runtime.ingestor, runtime.sessions, start, max_pages=1)  # a budget cut deletes nothing
    assert (cut["pages"], cut["deleted"], cut["unvisited"]) == (1, 0, 2), cut
    assert "page budget" in cut["stopped"] and len(_sources(runtime, scope)) == 3
    other = sync_site(runtime.ingestor, runtime.sessions, scope.replace("/guide/", "/"), max_pages=1)
    assert (other["deleted"], other["unvisited"]) == (0, 3), other  # nor does another start page's crawl
    (root / "guide" / "apt.html").unlink()  # a page that answers 404 is gone
    fourth = sync_site(runtime.ingestor, runtime.sessions, start)
    assert (fourth["deleted"], fourth["unvisited"]) == (1, 0), fourth
    assert set(_sources(runtime, scope)) == {scope + "index.html", scope + "wal.html"}


def test_the_server_fetches_only_under_its_sync_urls(client: TestClient, site: tuple[str, Path]) -> None:
    start, _ = site
    rt = client.app.state.runtime  # type: ignore[attr-defined]
    r = client.post("/admin/api/sync", json={"site": start}, headers=AUTH)
    assert r.status_code == 409 and r.json()["error"]["code"] == "not_configured"
    rt.settings.sync_urls = "http://127.0.0.1:1/"
    assert client.post("/admin/api/sync", json={"site": start}, headers=AUTH).status_code == 422
    assert client.post("/admin/api/sync", json={"site": start, "git": start}, headers=AUTH).status_code == 422
    rt.settings.sync_urls = start.rsplit("/", 2)[0] + "/"
    job = client.post("/admin/api/sync", json={"site": start, "max_pages": 2}, headers=AUTH)
    assert job.status_code == 202, job.text
    done = wait_job(client, job.json()["id"])
    assert done["status"] == "done" and done["result"]["pages"] == 2, done


def test_a_site_honours_robots_txt_its_sitemap_and_the_depth_bound(site: tuple[str, Path], runtime: Runtime) -> None:
    start, root = site
    scope = start.rsplit("/", 1)[0] + "/"
    (root / "robots.txt").write_text("User-agent: *\nDisallow: /guide/apt.html\n")
    fenced = sync_site(runtime.ingestor, runtime.sessions, start)
    assert (fenced["pages"], fenced["robots_forbidden"], fenced["added"]) == (2, 1, 2), fenced
    assert set(_sources(runtime, scope)) == {scope + "index.html", scope + "wal.html"}

    (root / "robots.txt").unlink()  # a missing robots.txt allows all
    listed = (scope + "index.html", scope + "apt.html", scope.replace("/guide/", "/blog/post.html"))
    urls = "".join(f"<url><loc>{url}</loc></url>" for url in listed)  # the blog is outside the sitemap's folder
    sitemap = f'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>'
    (root / "guide" / "pages.xml").write_text(sitemap)
    (root / "guide" / "index.xml").write_text(
        '<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
        f"<sitemap><loc>{scope}pages.xml</loc></sitemap></sitemapindex>"
    )
    mapped = sync_site(runtime.ingestor, runtime.sessions, scope + "index.xml")
    counts = {k: mapped[k] for k in ("pages", "added", "unchanged", "deleted", "failed")}
    # links not followed; the stored page the sitemap leaves out is visited and kept
    assert counts == {"pages": 3, "added": 1, "unchanged": 2, "deleted": 0, "failed": 0}, mapped
    assert set(_sources(runtime, scope)) == {scope + "index.html", scope + "apt.html", scope + "wal.html"}

    shallow = sync_site(runtime.ingestor, runtime.sessions, start, max_depth=0)
    assert (shallow["pages"], shallow["deleted"], shallow["unchanged"]) == (3, 0, 3), shallow
    with pytest.raises(SourceUnavailable, match="not XML"):
        (root / "guide" / "bad.xml").write_text("<urlset><url>unclosed")
        sync_site(runtime.ingestor, runtime.sessions, scope + "bad.xml")


def test_robots_txt_is_read_as_rfc_9309_says() -> None:
    class Answer:
        def __init__(self, status: int, text: str = "") -> None:
            self.status_code, self.content = status, text.encode()

    page = "http://docs.example/guide/a.html"
    assert robots(page, lambda _: Answer(404)).can_fetch(AGENT, page)  # none: all allowed
    assert not robots(page, lambda _: Answer(503)).can_fetch(AGENT, page)  # server error: none allowed
    assert not robots(page, lambda _: (_ for _ in ()).throw(OSError("down"))).can_fetch(AGENT, page)
    rules = robots(page, lambda _: Answer(200, f"User-agent: {AGENT}\nDisallow: /guide/\nCrawl-delay: 2\n"))
    assert not rules.can_fetch(AGENT, page) and rules.can_fetch("other", page) and rules.crawl_delay(AGENT) == 2
