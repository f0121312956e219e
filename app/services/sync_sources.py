"""Sources beyond a local folder, mirrored as a folder is (app.services.sync `mirror`): a git
repository and a web site.

- **git**: cloned (`--depth 1`, the branch given or the default one), later fetched and reset, by
  the `git` command into `<data dir>/sources/`; its files are what `moerag ingest` takes from a
  folder. A file's source is `<url>/<path in the repository>`.
- **site**: crawled breadth-first from a start page, following links within the start page's
  folder on the same host (`https://docs.example.com/guide/` holds `.../guide/a.html`, not
  `.../blog/`), at most `max_pages` pages of the types moerag ingests, at most `max_depth` links
  away from the start; or, when the start URL is a sitemap (`.xml`: a `<urlset>` or a
  `<sitemapindex>` of them), exactly the pages it lists within its folder, links not followed.
  The host's robots.txt is honoured for the `moerag-sync` agent (RFC 9309: a missing robots.txt
  allows all, one that answers 5xx or cannot be fetched allows none; `Crawl-delay` is kept, up to
  CRAWL_DELAY_MAX seconds). A page's source is its URL without query or fragment. A page that
  fails to fetch is reported, not fatal; a page robots.txt forbids is counted, not fetched.

A server fetches only URLs under `MOERAG_SYNC_URLS` (`allowed_url`): a sync is a request the
server makes on the caller's behalf.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from collections import deque
from collections.abc import Callable
from functools import partial
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag, urljoin, urlsplit
from urllib.robotparser import RobotFileParser

from sqlalchemy.orm import Session

from app.errors import ApiError
from app.services.documents import Ingestor, Upload
from app.services.sync import Progress, folder_files, mirror, read_file
from engine.errors import NotConfigured, SourceUnavailable
from engine.parsing import SUFFIXES

GIT_SECONDS = 300  # a clone or fetch that takes longer fails the sync
PAGE_SECONDS = 30  # one page's fetch
PAGE_BYTES = 20 * 1024 * 1024  # a larger page is reported as failed
MAX_PAGES = 200  # the default crawl bound
MAX_DEPTH = 5  # links followed from the start page, by default
MAX_SITEMAPS = 50  # sitemaps read from one sitemap index
CRAWL_DELAY_MAX = 5.0  # seconds: a longer robots.txt Crawl-delay is cut to this
AGENT = "moerag-sync"
_SCHEMES = ("http://", "https://", "file://", "ssh://", "git@")


def allowed_url(url: str, allowed: str) -> str:
    """`url` if it starts with one of `allowed` (MOERAG_SYNC_URLS, whitespace-separated prefixes)."""
    prefixes = allowed.split()
    if not prefixes:
        raise NotConfigured("this server fetches no URL: set MOERAG_SYNC_URLS to the URL prefixes it may mirror")
    if not url.startswith(_SCHEMES):
        raise ApiError("invalid_request", f"{url!r} is not an http(s), file, ssh or git URL")
    if not any(url.startswith(p) for p in prefixes):
        raise ApiError("invalid_request", f"{url} is outside MOERAG_SYNC_URLS")
    return url


# ---- git ----------------------------------------------------------------------------------------


def _git(*args: str) -> None:
    if shutil.which("git") is None:
        raise NotConfigured("syncing a git repository needs the `git` command on this machine")
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}  # never wait for a password
    try:
        done = subprocess.run(["git", *args], capture_output=True, text=True, timeout=GIT_SECONDS, env=env)
    except subprocess.TimeoutExpired:
        raise SourceUnavailable(f"git {args[0]} took over {GIT_SECONDS} s") from None
    if done.returncode != 0:
        raise SourceUnavailable(f"git {args[0]} failed: {done.stderr.strip()[-500:]}")


def checkout(url: str, branch: str | None, cache: Path) -> Path:
    """The repository's files at the branch's newest commit, in a folder of `cache`."""
    dest = cache / hashlib.sha256(f"{url}#{branch or ''}".encode()).hexdigest()[:16]
    if (dest / ".git").is_dir():
        _git("-C", str(dest), "fetch", "--quiet", "--depth", "1", "origin", branch or "HEAD")
        _git("-C", str(dest), "reset", "--quiet", "--hard", "FETCH_HEAD")
    else:
        shutil.rmtree(dest, ignore_errors=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        _git("clone", "--quiet", "--depth", "1", *(["--branch", branch] if branch else []), "--", url, str(dest))
    return dest


def sync_git(
    ingestor: Ingestor,
    sessions: Callable[[], Session],
    url: str,
    branch: str | None,
    cache: Path,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Mirror a git repository's files: -> {git, branch, added, updated, ..., failures}."""
    root = checkout(url, branch, cache)
    prefix = url.rstrip("/") + "/"
    readers = {}
    for path in folder_files(root).values():
        source = prefix + path.relative_to(root).as_posix()
        readers[source] = partial(read_file, path, source)
    return {"git": url, "branch": branch, **mirror(ingestor, sessions, prefix, readers, progress)}


def _given(upload: Upload) -> Upload:
    return upload


# ---- a web site ---------------------------------------------------------------------------------


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs.extend(v for k, v in attrs if k == "href" and v)


def _page_url(url: str) -> str:
    """Without fragment or query: one document per page."""
    return urldefrag(url)[0].split("?", 1)[0]


def _scope(start: str) -> str:
    """The folder a crawl from `start` stays in: the start page's own."""
    return start if start.endswith("/") else start.rsplit("/", 1)[0] + "/"


def _wanted(url: str, scope: str) -> bool:
    path = urlsplit(url).path
    suffix = Path(path).suffix.lower()
    return url.startswith(scope) and (path.endswith("/") or suffix in ("", ".htm", ".html") or suffix in SUFFIXES)


def robots(start: str, get: Callable[[str], Any]) -> RobotFileParser:
    """The start host's robots.txt, read as RFC 9309 says: 4xx allows all, 5xx or no answer none."""
    parts = urlsplit(start)
    where = f"{parts.scheme}://{parts.netloc}/robots.txt"
    rules = RobotFileParser(where)
    try:
        r = get(where)
    except Exception:  # unreachable: assume complete disallow
        r = None
    if r is None or r.status_code >= 500:
        rules.parse(["User-agent: *", "Disallow: /"])
    elif r.status_code >= 400:
        rules.parse([])
    else:
        rules.parse(r.content.decode("utf-8", errors="replace").splitlines())
    return rules
    if r.status_code >= 500:
        rules.disallow_all = True
    elif r.status_code >= 400:
        rules.allow_all = True
    else:
        rules.parse(r.content.decode("utf-8", errors="replace").splitlines())
    return rules


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def sitemap_pages(url: str, get: Callable[[str], Any]) -> list[str]:
    """The page URLs a sitemap lists (a sitemap index: those of its sitemaps, at most MAX_SITEMAPS);
    a sitemap that cannot be read is SourceUnavailable."""
    pages: list[str] = []
    queue, read = deque([url]), 0
    while queue and read < MAX_SITEMAPS:
        current = queue.popleft()
        read += 1
        try:
            r = get(current)
            if r.status_code != 200:
                raise SourceUnavailable(f"sitemap {current}: HTTP {r.status_code}")
            root = ET.fromstring(r.content)
        except ET.ParseError as exc:
            raise SourceUnavailable(f"sitemap {current} is not XML: {exc}") from None
        except SourceUnavailable:
            raise
        except Exception as exc:
            raise SourceUnavailable(f"sitemap {current}: {type(exc).__name__}: {exc}") from None
        locs = [el.text.strip() for el in root.iter() if _local(el.tag) == "loc" and el.text and el.text.strip()]
        (queue.extend if _local(root.tag) == "sitemapindex" else pages.extend)(locs)
    return pages


def is_sitemap(url: str) -> bool:
    return urlsplit(url).path.lower().endswith(".xml")


def crawl(
    start: str, max_pages: int, get: Callable[[str], Any], max_depth: int = MAX_DEPTH
) -> tuple[dict[str, Upload], list[dict[str, str]], int]:
    """Breadth-first from `start` within its folder, or the pages of the sitemap `start`:
    ({url: its upload}, [{source, error}], pages robots.txt forbade).
    `get(url)` is an httpx-like GET (a response with status_code, headers, content, url)."""
    scope = _scope(start)
    rules = robots(start, get)
    delay = min(float(rules.crawl_delay(AGENT) or 0), CRAWL_DELAY_MAX)
    listed = is_sitemap(start)
    first = (
        [u for u in map(_page_url, sitemap_pages(start, get)) if _wanted(u, scope)] if listed else [_page_url(start)]
    )
    queue, seen = deque((u, 0) for u in dict.fromkeys(first)), set(first)
    pages: dict[str, Upload] = {}
    failures: list[dict[str, str]] = []
    forbidden, fetched = 0, 0
    while queue and len(pages) < max_pages:
        url, depth = queue.popleft()
        if not rules.can_fetch(AGENT, url):
            forbidden += 1
            continue
        if delay and fetched:
            time.sleep(delay)
        fetched += 1
        try:
            r = get(url)
        except Exception as exc:  # any transport error: that page fails, the crawl goes on
            failures.append({"source": url, "error": f"fetch failed: {type(exc).__name__}: {exc}"})
            continue
        if r.status_code != 200:
            failures.append({"source": url, "error": f"HTTP {r.status_code}"})
            continue
        if len(r.content) > PAGE_BYTES:
            failures.append({"source": url, "error": f"larger than {PAGE_BYTES} bytes"})
            continue
        kind = r.headers.get("content-type", "").split(";")[0].strip() or None
        name = Path(urlsplit(url).path).name or "index.html"
        pages[url] = Upload(data=r.content, source=url, filename=name, content_type=kind)
        if not listed and depth < max_depth and kind in ("text/html", "application/xhtml+xml"):
            links = _Links()
            links.feed(r.content.decode(r.encoding or "utf-8", errors="replace"))
            for href in links.hrefs:
                target = _page_url(urljoin(str(r.url), href))
                if target not in seen and _wanted(target, scope):
                    seen.add(target)
                    queue.append((target, depth + 1))
    return pages, failures, forbidden


def sync_site(
    ingestor: Ingestor,
    sessions: Callable[[], Session],
    start: str,
    max_pages: int = MAX_PAGES,
    progress: Progress | None = None,
    max_depth: int = MAX_DEPTH,
) -> dict[str, Any]:
    """Mirror a site's pages under the start page's folder: -> {site, pages, robots_forbidden,
    added, ..., failures}."""
    import httpx

    with httpx.Client(timeout=PAGE_SECONDS, follow_redirects=True, headers={"User-Agent": AGENT}) as http:
        pages, unreachable, forbidden = crawl(start, max_pages, http.get, max_depth)
    if not pages:
        why = f"robots.txt forbids {forbidden} page(s) to {AGENT}" if forbidden else f"{unreachable[:3]}"
        raise SourceUnavailable(f"no page of {start} could be fetched: {why}")
    # A page that did not answer this time is kept, not deleted: only pages the crawl reached count.
    readers = {url: partial(_given, upload) for url, upload in pages.items()}
    kept = {f["source"] for f in unreachable}
    result = mirror(ingestor, sessions, _scope(start), readers, progress, keep=kept)
    result["failed"] += len(unreachable)
    result["failures"] = (unreachable + result["failures"])[:100]
    return {"site": start, "pages": len(pages), "robots_forbidden": forbidden, **result}
