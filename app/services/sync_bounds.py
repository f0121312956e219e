"""The bounds of what a sync fetches: URLs compared as URLs, and pages read within a byte and a
time budget.

- **URLs** (`allowed_url`, `within`): a URL is parsed and normalised (scheme and host in lower
  case, the scheme's default port made explicit, dot segments resolved, `%2e` read as `.`) and
  matched segment by segment against MOERAG_SYNC_URLS: `http://h:8410/docs` holds
  `http://h:8410/docs/a.html`, never `http://h:84100/`, `http://h:8410/docsx` or
  `http://h.evil.net:8410/docs`. A URL with a password (`user:pass@`) is refused: it would be
  stored as every document's source; git's ssh user (`git@host:org/repo`) is part of the place
  and must match the prefix's. A `file://` URL is compared by its real path (links resolved).
  The normalised URL is what is fetched, so the checked place is the fetched place.
- **Pages** (`PageFetcher`): redirects are followed by hand, at most MAX_REDIRECTS, each hop
  checked like the first (a refused hop is reported, not followed); bytes are counted while they
  stream and the read stops at the limit; each page has a deadline for the whole of it (not per
  read), so a page that trickles a byte a second ends at its time limit.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import SplitResult, unquote, urljoin, urlsplit, urlunsplit

from engine.errors import InvalidRequest, NotConfigured

if TYPE_CHECKING:
    import httpx

MAX_REDIRECTS = 5  # hops one page may take
_DEFAULT_PORTS = {"http": 80, "https": 443, "ssh": 22, "git": 9418}
_SCP = re.compile(r"^(?:(?P<user>[^@/:]+)@)?(?P<host>[^/:]+):(?!//)(?P<path>.*)$")  # git@host:org/repo.git
_DOT = re.compile(r"%2e", re.IGNORECASE)
_ENCODED_SEPARATOR = re.compile(r"%(2f|5c)", re.IGNORECASE)  # a server may read either as a folder's end


@dataclass(frozen=True)
class Place:
    """A URL reduced to what bounds compare: scheme, user (ssh only), host, port, path segments."""

    scheme: str
    user: str
    host: str
    port: int | None
    segments: tuple[str, ...]
    url: str  # the normalised URL: what is fetched

    def holds(self, other: Place) -> bool:
        """Whether `other` lies at or under this prefix, compared part by part."""
        return (self.scheme, self.user, self.host, self.port) == (
            other.scheme,
            other.user,
            other.host,
            other.port,
        ) and other.segments[: len(self.segments)] == self.segments


def _segments(path: str) -> list[str]:
    """RFC 3986's remove_dot_segments over `path` ('%2e' counted as '.'): its segments, without
    the leading empty one; a trailing slash leaves a last empty segment."""
    out: list[str] = []
    parts = path.split("/")[1:] if path.startswith("/") else path.split("/")
    for i, raw in enumerate(parts):
        seg = _DOT.sub(".", raw)
        last = i == len(parts) - 1
        if seg == ".":
            if last:
                out.append("")
        elif seg == "..":
            if out:
                out.pop()
            if last:
                out.append("")
        else:
            out.append(raw)
    return out


def _parsed(url: str) -> tuple[SplitResult, int | None]:
    """`url` split (git's scp-like `user@host:path` read as the ssh URL it names) with its port,
    once the parts a sync never takes are refused: spaces, backslashes, control characters, an
    encoded slash, a scheme other than http(s), ssh, git or file, credentials."""
    text = url.strip()
    if any(c in text for c in "\\\x00\r\n\t "):
        raise InvalidRequest(f"{url!r}: a URL to sync cannot hold spaces, backslashes or control characters")
    scp = _SCP.match(text) if "://" not in text else None
    if scp is not None:
        text = f"ssh://{scp['user'] + '@' if scp['user'] else ''}{scp['host']}/{scp['path'].lstrip('/')}"
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise InvalidRequest(f"{url!r} is not a URL: {exc}") from None
    if _ENCODED_SEPARATOR.search(parts.path):
        raise InvalidRequest(f"{url!r}: a URL to sync cannot hold an encoded slash or backslash")
    if parts.scheme.lower() not in ("http", "https", "ssh", "git", "file"):
        raise InvalidRequest(f"{url!r} is not an http(s), file, ssh or git URL")
    if parts.password is not None or (parts.username is not None and parts.scheme.lower() != "ssh"):
        raise InvalidRequest(
            "a URL to sync cannot carry credentials (they would be stored as every document's source): "
            "give the server access another way (a git credential helper, an ssh key)",
        )
    return parts, port


def place(url: str) -> Place:
    """`url` parsed and normalised; InvalidRequest for what cannot be a sync source."""
    parts, port = _parsed(url)
    scheme, host = parts.scheme.lower(), (parts.hostname or "").rstrip(".")
    if scheme == "file":
        if host not in ("", "localhost"):
            raise InvalidRequest(f"{url!r}: a file URL names no other host")
        real = os.path.realpath(unquote(parts.path) or "/")
        return Place("file", "", "", None, tuple(_segments(real)), "file://" + real)
    if not host:
        raise InvalidRequest(f"{url!r} names no host")
    segments = _segments(parts.path or "/")
    netloc = (f"{parts.username}@" if parts.username else "") + (f"[{host}]" if ":" in host else host)
    port = port or _DEFAULT_PORTS.get(scheme)
    if port != _DEFAULT_PORTS.get(scheme):
        netloc += f":{port}"
    normal = urlunsplit((scheme, netloc, "/" + "/".join(segments), parts.query, ""))
    return Place(scheme, parts.username or "", host, port, tuple(segments), normal)


def _prefix(text: str) -> Place:
    """A MOERAG_SYNC_URLS entry as a place; a trailing slash names the same folder as none."""
    found = place(text)
    segments = found.segments[:-1] if found.segments and found.segments[-1] == "" else found.segments
    return Place(found.scheme, found.user, found.host, found.port, segments, found.url)


@dataclass(frozen=True)
class Bounds:
    """The places a sync may fetch (MOERAG_SYNC_URLS); `open`: none set, anything goes (the CLI
    syncing on its own machine)."""

    prefixes: tuple[Place, ...] = field(default=())
    open: bool = False

    @classmethod
    def of(cls, allowed: str) -> Bounds:
        return cls(tuple(_prefix(p) for p in allowed.split()))

    def also(self, url: str) -> Bounds:
        """These bounds and the place `url` (a host's robots.txt beside a folder allowed on it)."""
        return self if self.open else Bounds((*self.prefixes, _prefix(url)))

    def check(self, url: str) -> str:
        """The normalised `url`, if it lies under a prefix; InvalidRequest otherwise."""
        found = place(url)
        if not self.open and not any(p.holds(found) for p in self.prefixes):
            raise InvalidRequest(f"{found.url} is outside MOERAG_SYNC_URLS")
        return found.url


OPEN = Bounds(open=True)


def allowed_url(url: str, allowed: str) -> str:
    """`url` normalised, if it lies under one of `allowed` (MOERAG_SYNC_URLS, whitespace-separated
    prefixes); NotConfigured when none is set, InvalidRequest otherwise."""
    if not allowed.split():
        raise NotConfigured("this server fetches no URL: set MOERAG_SYNC_URLS to the URL prefixes it may mirror")
    return Bounds.of(allowed).check(url)


class FetchRefused(Exception):
    """A page not fetched, or not whole: its message says why (a hop out of bounds, too large, too slow)."""


@dataclass
class Fetched:
    """A page as the crawl uses it (the parts of an httpx response it reads)."""

    url: str  # where it was read, after the redirects
    status_code: int
    headers: dict[str, str]
    content: bytes
    encoding: str | None


class PageFetcher:
    """GETs within `bounds`, each page at most `max_bytes` and `seconds`, redirects checked hop by hop."""

    def __init__(self, http: httpx.Client, bounds: Bounds, *, max_bytes: int, seconds: float) -> None:
        self.http, self.bounds, self.max_bytes, self.seconds = http, bounds, max_bytes, seconds

    def __call__(self, url: str) -> Fetched:
        import httpx

        deadline = time.monotonic() + self.seconds
        for _ in range(MAX_REDIRECTS + 1):
            try:
                url = self.bounds.check(url)
            except InvalidRequest as exc:
                raise FetchRefused(f"not followed: {exc.message}") from None
            left = deadline - time.monotonic()
            if left <= 0:
                raise FetchRefused(f"took over {self.seconds:g} s")
            with self.http.stream("GET", url, timeout=httpx.Timeout(left), follow_redirects=False) as r:
                if r.is_redirect and "location" in r.headers:
                    url = urljoin(url, r.headers["location"])
                    continue
                data = self._read(r.iter_bytes(), r.headers.get("content-length"), deadline)
                return Fetched(str(r.url), r.status_code, dict(r.headers), data, r.encoding)
        raise FetchRefused(f"more than {MAX_REDIRECTS} redirects")

    def _read(self, chunks: Iterable[bytes], declared: str | None, deadline: float) -> bytes:
        """The body, counted while it streams: cut at `max_bytes` and at the page's deadline."""
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            raise FetchRefused(f"larger than {self.max_bytes} bytes (Content-Length {declared})")
        body = bytearray()
        for chunk in chunks:
            body += chunk
            if len(body) > self.max_bytes:
                raise FetchRefused(f"larger than {self.max_bytes} bytes")
            if time.monotonic() > deadline:
                raise FetchRefused(f"took over {self.seconds:g} s ({len(body)} bytes read)")
        return bytes(body)
