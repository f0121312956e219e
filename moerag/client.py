"""moerag's Python client: the HTTP API, typed, synchronous (`Client`) and asynchronous
(`AsyncClient`), on httpx. The CLI's remote mode runs through it.

    from moerag.client import Client

    with Client("http://127.0.0.1:8000", token="…") as kb:
        kb.upload_folder("docs/", progress=lambda done, total: print(done, "/", total))
        answer = kb.ask("How do I undo the last commit?")
        print(answer["answer"], answer["route"]["path"])

Every refusal is an `ApiError` with the server's status, `code` and `message`; a server that
cannot be reached is an `Unreachable`. Long work (bulk uploads, router training, reclustering)
is a job: the methods that start one wait for it by default, reporting `progress(done, total)`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from moerag.admin import AdminCalls, AsyncAdminCalls
from moerag.types import Answer, Citation, Job, Json, Progress, Route

__all__ = [
    "Answer",
    "ApiError",
    "AsyncClient",
    "Citation",
    "Client",
    "Job",
    "JobFailed",
    "Json",
    "Route",
    "Unreachable",
]
UPLOAD_BATCH = 50  # files a bulk upload sends at once
POLL_SECONDS = 0.5  # how often a job is read while waiting for it
# What a folder upload sends: engine.parsing.SUFFIXES (the client imports nothing of the server's).
SUFFIXES = frozenset(
    {".txt", ".text", ".rst", ".md", ".markdown", ".html", ".htm", ".xhtml", ".pdf", ".docx", ".pptx", ".xlsx", ".odt"}
)


class ApiError(Exception):
    """The server refused a request: its HTTP status and moerag's error `code` and `message`."""

    def __init__(self, url: str, status: int, code: str, message: str) -> None:
        super().__init__(f"{url} answered {status}: {code}: {message}")
        self.url, self.status, self.code, self.message = url, status, code, message


class Unreachable(ApiError):
    """No answer from the server at all (refused, timed out, reset)."""

    def __init__(self, url: str, reason: str) -> None:
        Exception.__init__(self, f"cannot reach {url}: {reason}")
        self.url, self.status, self.code, self.message = url, 0, "unreachable", reason


class JobFailed(ApiError):
    """A job the server ran ended `failed`: its id, kind and error."""

    def __init__(self, url: str, job: Job) -> None:
        Exception.__init__(self, f"job {job['id']} ({job['kind']}) failed: {job['error']}")
        self.url, self.status, self.code, self.message, self.job = url, 200, "job_failed", str(job["error"]), job


def _error(url: str, r: httpx.Response) -> ApiError:
    try:
        err = r.json()["error"]
        return ApiError(url, r.status_code, str(err["code"]), str(err["message"]))
    except (ValueError, KeyError, TypeError):
        return ApiError(url, r.status_code, "http_error", r.text[:300])


def _ask_body(question: str, **options: Any) -> Json:
    return {"query": question, **{k: v for k, v in options.items() if v is not None}}


def folder_files(folder: str | Path) -> list[Path]:
    """The files a folder upload sends, as `moerag ingest` walks a folder: every file of a type
    moerag reads, in path order, hidden entries and symbolic links skipped."""
    return walk_folder(folder)[0]


def walk_folder(folder: str | Path) -> tuple[list[Path], list[Json]]:
    """(the files a folder upload sends, the files it leaves out: [{path, reason}]), as the
    server's folder walk (engine.parsing.walk_documents) sees them."""
    root = Path(folder)
    files, skipped = [], []
    for f in sorted(root.rglob("*")):
        inside = f.relative_to(root)
        if any(part.startswith(".") for part in inside.parts):
            continue
        steps = [root.joinpath(*inside.parts[: n + 1]) for n in range(len(inside.parts))]  # below root only
        if any(step.is_symlink() for step in steps[:-1]):
            continue  # under a linked folder: the link itself is reported
        if f.is_symlink():
            skipped.append({"path": inside.as_posix(), "reason": "a symbolic link (never followed)"})
            continue
        if not f.is_file():
            continue
        if f.suffix.lower() in SUFFIXES:
            files.append(f)
        else:
            kind = f.suffix.lower() or "no extension"
            skipped.append({"path": inside.as_posix(), "reason": f"unsupported type ({kind})"})
    return files, skipped


def folder_source(path: Path, root: Path) -> str:
    """A document's source when its folder was given: the folder's name and the path inside it,
    as the server's CLI stores it (engine.parsing.folder_source)."""
    return f"{Path(root).resolve().name}/{Path(path).relative_to(root).as_posix()}"


def _batches(
    files: Sequence[str | Path], batch: int, sources: Sequence[str] | None = None
) -> Iterator[list[tuple[str, tuple[str, bytes]]]]:
    paths = [Path(f) for f in files]
    names = list(sources) if sources is not None else [str(p) for p in paths]
    for start in range(0, len(paths), batch):
        yield [("files", (names[n], paths[n].read_bytes())) for n in range(start, min(start + batch, len(paths)))]


def _shifted(progress: Progress | None, base: int, total: int) -> Progress | None:
    """One batch's job progress as progress over all the files."""
    if progress is None:
        return None
    return lambda done, _total: progress(base + done, total)


def _one_file(path: str | Path, title: str | None, source: str | None) -> Json:
    """The multipart body of one file's upload (its source: as given, else its path)."""
    p = Path(path)
    data = {k: v for k, v in {"title": title, "source": source or str(p)}.items() if v is not None}
    return {"files": {"file": (p.name, p.read_bytes())}, "data": data}


def _no_uploads() -> Json:
    return {"created": 0, "duplicate": 0, "failed": 0, "chunks": 0, "failures": []}


def _tally(totals: dict[str, Any], job: Job) -> None:
    result = job["result"] or {}
    for key in ("created", "duplicate", "failed", "chunks"):
        totals[key] += result.get(key, 0)
    totals["failures"] += result.get("failures", [])


def _sse(line: str, name: str) -> tuple[str, Json | None]:
    """One line of a server-sent event stream, given the current event's name: (the name after
    it, its data when the line carries them)."""
    if line.startswith("event: "):
        return line[7:], None
    if line.startswith("data: "):
        return name, json.loads(line[6:])
    return name, None


def _events(lines: Iterator[str]) -> Iterator[tuple[str, Json]]:
    """Server-sent events as (name, data): `route`, `token`, `error`, `done`."""
    name = "message"
    for line in lines:
        name, data = _sse(line, name)
        if data is not None:
            yield name, data


class Client(AdminCalls):
    """A moerag server, synchronously. `token`: the admin token for writes, the read token (or
    none, where reads are open) for questions."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 300.0, **httpx_options: Any) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, **httpx_options)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, ok: tuple[int, ...] = (200,), **kw: Any) -> Any:
        """One call: the response's JSON (None when empty); ApiError for any other status."""
        try:
            r = self.http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise Unreachable(self.url, str(exc) or type(exc).__name__) from None
        if r.status_code not in ok:
            raise _error(f"{self.url}{path}", r)
        return r.json() if r.content else None

    # ---- questions ---------------------------------------------------------------------------

    def ask(self, question: str, **options: Any) -> Answer:
        """Route, retrieve, answer. Options as /ask takes them: k, mode, expert, generate, conversation_id."""
        return self.request("POST", "/ask", json=_ask_body(question, **options))

    def ask_stream(self, question: str, **options: Any) -> Iterator[tuple[str, Json]]:
        """The answer as it is made: ("route", route and citations), ("token", {"text"})…, ("done", …)."""
        body = _ask_body(question, stream=True, **options)
        try:
            with self.http.stream("POST", "/ask", json=body) as r:
                if r.status_code != 200:
                    r.read()
                    raise _error(f"{self.url}/ask", r)
                yield from _events(r.iter_lines())
        except httpx.HTTPError as exc:
            raise Unreachable(self.url, str(exc) or type(exc).__name__) from None

    def search(self, query: str, k: int | None = None, clusters: list[int] | None = None) -> Json:
        return self.request("POST", "/search", json={"query": query, "k": k, "clusters": clusters})

    # ---- documents ---------------------------------------------------------------------------

    def upload(self, path: str | Path, title: str | None = None, source: str | None = None) -> Json:
        """One file (text, Markdown, HTML, PDF, Office); the same bytes again answer `duplicate`."""
        return self.request("POST", "/documents", ok=(200, 201), **_one_file(path, title, source))

    def upload_many(
        self,
        files: Sequence[str | Path],
        progress: Progress | None = None,
        batch: int = UPLOAD_BATCH,
        sources: Sequence[str] | None = None,
    ) -> Json:
        """Many files through bulk jobs: totals created, duplicate, failed, chunks, and the failures.
        `sources`: each file's source (default: its path as given)."""
        totals = _no_uploads()
        base = 0
        for part in _batches(files, batch, sources):
            job = self.request("POST", "/documents/bulk", ok=(202,), files=part)
            job = self.wait(job, _shifted(progress, base, len(files)))
            _tally(totals, job)
            base += len(part)
        return totals

    def upload_folder(self, folder: str | Path, progress: Progress | None = None) -> Json:
        """Every file under `folder` of a type moerag reads, each stored as `folder-name/path`;
        the totals also count and list the files left out (`skipped`: [{path, reason}])."""
        files, skipped = walk_folder(folder)
        sources = [folder_source(f, Path(folder)) for f in files]
        totals = self.upload_many(files, progress, sources=sources) if files else _no_uploads()
        return totals | {"skipped": len(skipped), "skipped_files": skipped}

    # ---- jobs ---------------------------------------------------------------------------------------

    def job(self, job_id: int) -> Job:
        return self.request("GET", f"/jobs/{job_id}")

    def wait(self, job: Job, progress: Progress | None = None) -> Job:
        """Read the job until it ends, reporting progress; a failed job is a JobFailed."""
        while job["status"] not in ("done", "failed"):
            time.sleep(POLL_SECONDS)
            job = self.job(job["id"])
            if progress is not None:
                progress(job["done"], job["total"] or 1)
        if job["status"] == "failed":
            raise JobFailed(f"{self.url}/jobs/{job['id']}", job)
        return job


class AsyncClient(AsyncAdminCalls):
    """`Client`'s questions, searches, uploads and jobs for asyncio code (the same names, awaited)."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 300.0, **httpx_options: Any) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout, **httpx_options)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.http.aclose()

    async def request(self, method: str, path: str, ok: tuple[int, ...] = (200,), **kw: Any) -> Any:
        try:
            r = await self.http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise Unreachable(self.url, str(exc) or type(exc).__name__) from None
        if r.status_code not in ok:
            raise _error(f"{self.url}{path}", r)
        return r.json() if r.content else None

    async def ask(self, question: str, **options: Any) -> Answer:
        return await self.request("POST", "/ask", json=_ask_body(question, **options))

    async def ask_stream(self, question: str, **options: Any) -> AsyncIterator[tuple[str, Json]]:
        body = _ask_body(question, stream=True, **options)
        try:
            async with self.http.stream("POST", "/ask", json=body) as r:
                if r.status_code != 200:
                    await r.aread()
                    raise _error(f"{self.url}/ask", r)
                name = "message"
                async for line in r.aiter_lines():
                    name, data = _sse(line, name)
                    if data is not None:
                        yield name, data
        except httpx.HTTPError as exc:
            raise Unreachable(self.url, str(exc) or type(exc).__name__) from None

    async def search(self, query: str, k: int | None = None, clusters: list[int] | None = None) -> Json:
        return await self.request("POST", "/search", json={"query": query, "k": k, "clusters": clusters})

    async def upload(self, path: str | Path, title: str | None = None, source: str | None = None) -> Json:
        return await self.request("POST", "/documents", ok=(200, 201), **_one_file(path, title, source))

    async def upload_many(
        self,
        files: Sequence[str | Path],
        progress: Progress | None = None,
        batch: int = UPLOAD_BATCH,
        sources: Sequence[str] | None = None,
    ) -> Json:
        totals = _no_uploads()
        base = 0
        for part in _batches(files, batch, sources):
            job = await self.request("POST", "/documents/bulk", ok=(202,), files=part)
            job = await self.wait(job, _shifted(progress, base, len(files)))
            _tally(totals, job)
            base += len(part)
        return totals

    async def upload_folder(self, folder: str | Path, progress: Progress | None = None) -> Json:
        files, skipped = walk_folder(folder)
        sources = [folder_source(f, Path(folder)) for f in files]
        totals = await self.upload_many(files, progress, sources=sources) if files else _no_uploads()
        return totals | {"skipped": len(skipped), "skipped_files": skipped}

    async def job(self, job_id: int) -> Job:
        return await self.request("GET", f"/jobs/{job_id}")

    async def wait(self, job: Job, progress: Progress | None = None) -> Job:
        while job["status"] not in ("done", "failed"):
            await asyncio.sleep(POLL_SECONDS)
            job = await self.job(job["id"])
            if progress is not None:
                progress(job["done"], job["total"] or 1)
        if job["status"] == "failed":
            raise JobFailed(f"{self.url}/jobs/{job['id']}", job)
        return job
