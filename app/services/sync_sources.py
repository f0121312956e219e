"""Sources beyond a local folder, mirrored as a folder is (app.services.sync `mirror`): a git
repository and a web site.

- **git**: cloned (`--depth 1`, the branch given or the default one), later fetched and reset, by
  the `git` command into `<data dir>/sources/`, with symbolic links checked out as plain files and
  HTTP redirects refused; its files are what `moerag ingest` takes from a folder, less the
  repository's symbolic links (mode 120000 in the commit), which are skipped and reported. A
  file's source is `<url>/<path in the repository>`; a file gone from the commit is deleted.
- **site**: crawled breadth-first from a start page, following links within the start page's
  folder on the same host (`https://docs.example.com/guide/` holds `.../guide/a.html`, not
  `.../blog/`), at most `max_pages` pages of the types moerag ingests, at most `max_depth` links
  away from the start; or, when the start URL is a sitemap (`.xml`: a `<urlset>` or a
  `<sitemapindex>` of them), exactly the pages it lists within its folder, links not followed.
  The host's robots.txt is honoured for the `moerag-sync` agent (RFC 9309: a missing robots.txt
  allows all, one that answers 5xx or cannot be fetched allows none; `Crawl-delay` is kept, up to
  CRAWL_DELAY_MAX seconds). A page's source is its URL without query or fragment. A page that
  fails to fetch is reported, not fatal; a page robots.txt forbids is counted, not fetched.
  Pages stored from earlier syncs that the crawl did not reach are visited after it, while the
  page budget lasts. Only a page that answers 404 or 410 is deleted: one the budget, the time
  limit or another start page did not reach is kept and counted `unvisited`.

A server fetches only URLs under `MOERAG_SYNC_URLS`, every redirect hop included, each page
within MOERAG_SYNC_PAGE_BYTES and MOERAG_SYNC_PAGE_SECONDS, a whole crawl within
MOERAG_SYNC_SECONDS (app.services.sync_bounds): a sync is a request the server makes on the
caller's behalf.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import partial
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag, urljoin, urlsplit
from urllib.robotparser import RobotFileParser

from sqlalchemy.orm import Session

from app.core.locking import dies_with_caller
from app.core.settings import Settings
from app.services.documents import Ingestor, Upload
from app.services.sync import (
    Progress,
    folder_files,
    mirror,
    read_inside,
    skipped_files,
    skipped_links,
    stored_sources,
)
from app.services.sync_bounds import OPEN, Bounds, FetchRefused, PageFetcher
from engine.errors import InvalidRequest, NotConfigured, SourceUnavailable
from engine.parsing import SUFFIXES

GIT_SECONDS = 300  # a clone or fetch that takes longer fails the sync
MAX_PAGES = 200  # the default crawl bound
MAX_DEPTH = 5  # links followed from the start page, by default
MAX_SITEMAPS = 50  # sitemaps read from one sitemap index
CRAWL_DELAY_MAX = 5.0  # seconds: a longer robots.txt Crawl-delay is cut to this
AGENT = "moerag-sync"
GONE = (404, 410)  # a page that answers these is deleted; any other failure keeps it


@dataclass(frozen=True)
class FetchLimits:
    """What one site sync may spend (MOERAG_SYNC_PAGE_BYTES, MOERAG_SYNC_PAGE_SECONDS, MOERAG_SYNC_SECONDS)."""

    page_bytes: int
    page_seconds: float
    sync_seconds: float

    @classmethod
    def of(cls, settings: Settings) -> FetchLimits:
        return cls(settings.sync_page_bytes, settings.sync_page_seconds, settings.sync_seconds)

    @classmethod
    def defaults(cls) -> FetchLimits:
        """The settings' defaults (the settings are where each limit is stated)."""
        fields = Settings.model_fields
        return cls(
            fields["sync_page_bytes"].default, fields["sync_page_seconds"].default, fields["sync_seconds"].default
        )


# ---- git ----------------------------------------------------------------------------------------


def _git(*args: str) -> str:
    if shutil.which("git") is None:
        raise NotConfigured("syncing a git repository needs the `git` command on this machine")
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}  # never wait for a password
    # Symbolic links become plain files holding their target's name (and are skipped: `_links`);
    # an HTTP redirect is refused, not followed to a place MOERAG_SYNC_URLS did not allow.
    safe = ("-c", "core.symlinks=false", "-c", "http.followRedirects=false")
    try:
        done = subprocess.run(
            ["git", *safe, *args],
            capture_output=True,
            text=True,
            timeout=GIT_SECONDS,
            env=env,
            preexec_fn=dies_with_caller,  # a killed server leaves no git behind
        )
    except subprocess.TimeoutExpired:
        raise SourceUnavailable(f"git {args[0]} took over {GIT_SECONDS} s") from None
    if done.returncode != 0:
        raise SourceUnavailable(f"git {args[0]} failed: {done.stderr.strip()[-500:]}")
    return done.stdout


def _links(root: Path) -> set[str]:
    """The paths the checked-out commit holds as symbolic links (mode 120000)."""
    listed = _git("-C", str(root), "ls-files", "-s", "-z")
    return {entry.split("\t", 1)[1] for entry in listed.split("\0") if entry.startswith("120000 ")}


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
    bounds: Bounds = OPEN,
) -> dict[str, Any]:
    """Mirror a git repository's files: -> {git, branch, added, updated, ..., links_skipped,
    failures}. `url` is checked against `bounds` (the server's MOERAG_SYNC_URLS) and normalised."""
    try:
        url = bounds.check(url)
    except InvalidRequest as exc:
        raise SourceUnavailable(exc.message) from None
    if branch is not None and branch.startswith("-"):
        raise SourceUnavailable(f"{branch!r} is not a branch name")
    root = checkout(url, branch, cache)
    prefix = url.rstrip("/") + "/"
    files, links, unsupported = folder_files(root)
    committed = _links(root)  # checked out as plain files holding their targets' names: never read
    readers = {}
    for path in files.values():
        name = path.relative_to(root).as_posix()
        if name not in committed:
            readers[prefix + name] = partial(read_inside, root, path, prefix + name)
    counts = mirror(ingestor, sessions, prefix, readers, progress)
    unsupported = [u for u in unsupported if u["path"] not in committed]  # a committed link is a link
    skipped = skipped_links(sorted(committed | set(links))) | skipped_files(unsupported)
    return {"git": url, "branch": branch, **counts, **skipped}


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


def robots_url(start: str) -> str:
    parts = urlsplit(start)
    return f"{parts.scheme}://{parts.netloc}/robots.txt"


def robots(start: str, get: Callable[[str], Any]) -> RobotFileParser:
    """The start host's robots.txt, read as RFC 9309 says: 4xx allows all, 5xx or no answer none."""
    where = robots_url(start)
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


@dataclass
class Crawl:
    """What a crawl read: the pages, the failures, the pages robots.txt forbade, the pages that
    said they are gone (404, 410) and why it stopped early (the page budget, the time limit)."""

    pages: dict[str, Upload] = field(default_factory=dict)
    failures: list[dict[str, str]] = field(default_factory=list)
    forbidden: int = 0
    gone: set[str] = field(default_factory=set)
    stopped: str | None = None


class _Frontier:
    """The pages a crawl has yet to fetch: links breadth-first from the start pages (each with its
    depth), then the stored pages it did not reach (no link followed from them); each page once."""

    def __init__(self, scope: str, first: list[str], known: Collection[str], max_depth: int) -> None:
        self.scope, self.max_depth = scope, max_depth
        self.queue = deque((u, 0) for u in dict.fromkeys(first))
        self.seen = set(first)
        self.revisits = deque(u for u in known if _wanted(u, scope))

    def next(self) -> tuple[str, int] | None:
        while not self.queue and self.revisits:  # the links are exhausted: the stored pages not reached
            url = self.revisits.popleft()
            if url not in self.seen:
                self.seen.add(url)
                self.queue.append((url, self.max_depth))
        return self.queue.popleft() if self.queue else None

    def follow(self, page: Any, depth: int) -> None:
        """Queue the links of an HTML page fetched at `depth`, within the scope, while depth allows."""
        if depth >= self.max_depth:
            return
        links = _Links()
        links.feed(page.content.decode(page.encoding or "utf-8", errors="replace"))
        for href in links.hrefs:
            target = _page_url(urljoin(str(page.url), href))
            if target not in self.seen and _wanted(target, self.scope):
                self.seen.add(target)
                self.queue.append((target, depth + 1))


def _fetch(get: Callable[[str], Any], url: str, out: Crawl) -> Any | None:
    """The page at `url` when it answers 200; otherwise None, its failure recorded (and the page
    marked gone on a 404 or 410)."""
    try:
        r = get(url)
    except Exception as exc:  # any transport error or refusal: that page fails, the crawl goes on
        why = str(exc) if isinstance(exc, FetchRefused) else f"fetch failed: {type(exc).__name__}: {exc}"
        out.failures.append({"source": url, "error": why})
        return None
    if r.status_code != 200:
        out.failures.append({"source": url, "error": f"HTTP {r.status_code}"})
        if r.status_code in GONE:
            out.gone.add(url)
        return None
    return r


def crawl(
    start: str,
    max_pages: int,
    get: Callable[[str], Any],
    max_depth: int = MAX_DEPTH,
    *,
    known: Collection[str] = (),
    seconds: float | None = None,
    progress: Progress | None = None,
    rules: RobotFileParser | None = None,
) -> Crawl:
    """Breadth-first from `start` within its folder, or the pages of the sitemap `start`, then the
    `known` pages (stored earlier) it did not reach, at most `max_pages` fetched, within `seconds`.
    `get(url)` is an httpx-like GET (a response with status_code, headers, content, url); it may
    raise (that page fails, FetchRefused included). `rules`: the host's robots.txt, read with `get`
    when not given."""
    scope = _scope(start)
    deadline = None if seconds is None else time.monotonic() + seconds
    rules = rules or robots(start, get)
    delay = min(float(rules.crawl_delay(AGENT) or 0), CRAWL_DELAY_MAX)
    listed = is_sitemap(start)  # a sitemap's pages: links not followed
    first = (
        [u for u in map(_page_url, sitemap_pages(start, get)) if _wanted(u, scope)] if listed else [_page_url(start)]
    )
    frontier = _Frontier(scope, first, known, 0 if listed else max_depth)
    out, fetched = Crawl(), 0
    while (step := frontier.next()) is not None:
        if fetched >= max_pages:
            out.stopped = f"the page budget ({max_pages}) was spent"
            break
        if deadline is not None and time.monotonic() > deadline:
            out.stopped = f"the time limit ({seconds:g} s) was reached"
            break
        url, depth = step
        if not rules.can_fetch(AGENT, url):
            out.forbidden += 1
            continue
        if delay and fetched:
            time.sleep(delay)
        fetched += 1
        if progress is not None:
            progress(fetched, max_pages)
        if (r := _fetch(get, url, out)) is None:
            continue
        kind = r.headers.get("content-type", "").split(";")[0].strip() or None
        name = Path(urlsplit(url).path).name or "index.html"
        out.pages[url] = Upload(data=r.content, source=url, filename=name, content_type=kind)
        if kind in ("text/html", "application/xhtml+xml"):
            frontier.follow(r, depth)
    return out


def sync_site(
    ingestor: Ingestor,
    sessions: Callable[[], Session],
    start: str,
    max_pages: int = MAX_PAGES,
    progress: Progress | None = None,
    max_depth: int = MAX_DEPTH,
    *,
    bounds: Bounds = OPEN,
    limits: FetchLimits | None = None,
) -> dict[str, Any]:
    """Mirror a site's pages under the start page's folder: -> {site, pages, robots_forbidden,
    added, ..., deleted (pages that answered 404/410), unvisited (stored pages kept unread),
    stopped, failures}. Every URL fetched, redirects included, lies within `bounds`."""
    import httpx

    try:
        start = bounds.check(start)
    except InvalidRequest as exc:
        raise SourceUnavailable(exc.message) from None
    scope, limits = _scope(start), limits or FetchLimits.defaults()
    known = sorted(stored_sources(sessions, scope))
    with httpx.Client(headers={"User-Agent": AGENT}) as http:
        get = PageFetcher(http, bounds, max_bytes=limits.page_bytes, seconds=limits.page_seconds)
        # the host's robots.txt is read even where MOERAG_SYNC_URLS allows only a folder of it
        where = robots_url(start)
        rules = robots(
            start, PageFetcher(http, bounds.also(where), max_bytes=limits.page_bytes, seconds=limits.page_seconds)
        )
        found = crawl(
            start, max_pages, get, max_depth, known=known, seconds=limits.sync_seconds, progress=progress, rules=rules
        )
    if not found.pages and not found.gone:
        why = f"robots.txt forbids {found.forbidden} page(s) to {AGENT}" if found.forbidden else f"{found.failures[:3]}"
        raise SourceUnavailable(f"no page of {start} could be fetched: {why}")
    readers = {url: partial(_given, upload) for url, upload in found.pages.items()}
    result = mirror(ingestor, sessions, scope, readers, progress, gone=found.gone)
    result["failed"] += len(found.failures)
    result["failures"] = (found.failures + result["failures"])[:100]
    extra = {"stopped": found.stopped} if found.stopped else {}
    return {"site": start, "pages": len(found.pages), "robots_forbidden": found.forbidden, **result, **extra}
