"""Every error leaves as JSON: {"error": {"code", "message"}} with a fitting 4xx/5xx status."""

from __future__ import annotations

import errno
import math
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import IntegrityError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.errors import MoeragError, RateLimited

# The HTTP status of every error code the API answers with: the one place statuses are chosen.
STATUS: dict[str, int] = {
    # engine and services (engine.errors)
    "invalid_document": 422,
    "unsupported_type": 415,
    "empty_document": 422,
    "document_too_large": 413,
    "undecodable_document": 422,
    "degenerate_document": 422,
    "corrupt_document": 422,
    "invalid_setting": 422,
    "not_found": 404,
    "conflict": 409,
    "not_trainable": 409,
    "not_configured": 409,
    "unknown_expert": 422,
    "index_moved": 503,
    "source_unavailable": 502,
    # requests
    "malformed_json": 400,
    "invalid_request": 422,
    "missing_file": 422,
    "question_too_long": 422,
    "top_k_too_large": 422,
    "expert_not_found": 404,
    "model_not_found": 404,
    "unsupported_media_type": 415,
    "method_not_allowed": 405,
    "too_large": 413,
    "unauthorized": 401,
    "csrf": 403,
    "scoped_token": 403,
    "out_of_scope": 403,
    "rate_limited": 429,
    "too_many_jobs": 429,
    # the server and what it depends on
    "not_ready": 503,
    "generator_unavailable": 503,
    "generator_failed": 502,
    "disk_full": 507,
}

# How a full disk shows itself: ENOSPC/EDQUOT from the OS, SQLite's "database or disk is full",
# PostgreSQL's SQLSTATE 53100 (disk_full).
_DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc`, or what it wraps, says that the disk is full."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _DISK_FULL_ERRNOS:
            return True
        if "disk is full" in str(seen) or getattr(seen, "sqlstate", None) == "53100":
            return True
        seen = seen.__cause__ or getattr(seen, "orig", None)
    return False


DISK_FULL_MESSAGE = "the server's disk is full: nothing of this request was kept; retry once space is freed"


class ApiError(Exception):
    """An error the API layer itself raises (request shape, auth, limits); status from STATUS."""

    def __init__(self, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = STATUS[code], code, message, headers


def headers_of(exc: MoeragError) -> dict[str, str] | None:
    """The HTTP headers a domain error asks for: Retry-After for a rate limit."""
    if isinstance(exc, RateLimited):
        return {"Retry-After": str(math.ceil(exc.retry_after_s))}
    return None


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **extra}}


OPENAI_PREFIX = "/v1/"  # the OpenAI-compatible routes: their errors also carry OpenAI's `type` and `param`
_OPENAI_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 429: "rate_limit_error"}


def _error(request: Request, code: str, message: str, status: int, headers: Any = None, **extra: Any) -> JSONResponse:
    body = error_body(code, message, **extra)
    if request.url.path.startswith(OPENAI_PREFIX):
        kind = "server_error" if status >= 500 else _OPENAI_TYPES.get(status, "invalid_request_error")
        body["error"] |= {"type": kind, "param": None}
    return JSONResponse(body, status, headers=headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api(request: Request, exc: ApiError) -> JSONResponse:
        return _error(request, exc.code, exc.message, exc.status, exc.headers)

    @app.exception_handler(MoeragError)
    async def _moerag(request: Request, exc: MoeragError) -> JSONResponse:
        return _error(request, exc.code, exc.message, STATUS.get(exc.code, 400), headers_of(exc))

    @app.exception_handler(IntegrityError)
    async def _integrity(request: Request, exc: IntegrityError) -> JSONResponse:
        # A row the request refers to went away (or appeared) in a concurrent change.
        return _error(request, "conflict", "a concurrent change got there first; read and retry", 409)

    @app.exception_handler(OperationalError)
    @app.exception_handler(OSError)
    async def _storage(request: Request, exc: Exception) -> JSONResponse:
        # A full disk refuses the write, which was rolled back whole: 507, not a 500 and a reset.
        if is_disk_full(exc):
            return _error(request, "disk_full", DISK_FULL_MESSAGE, STATUS["disk_full"])
        raise exc

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return _error(request, "malformed_json", "the request body is not valid JSON", 400)
        details = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "")} for e in errors]
        return _error(request, "invalid_request", "the request is not valid", 422, details=details)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized", 413: "too_large"}.get(
            exc.status_code, "http_error"
        )
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # Starlette names the first route's methods; a path may have several
            headers["Allow"] = ", ".join(allowed_methods(request))
        return _error(request, code, str(exc.detail), exc.status_code, headers)


def allowed_methods(request: Request) -> list[str]:
    """The methods the spec documents at this request's path (several routes may share it). A
    literal path (`/documents/bulk`) is its own resource, not an instance of `/documents/{id}`."""
    paths: dict[str, dict[str, Any]] = request.app.openapi().get("paths", {})
    path = request.url.path
    if path in paths:
        return sorted(m.upper() for m in paths[path])
    methods: set[str] = set()
    for template, operations in paths.items():
        if re.fullmatch(re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)), path):
            methods |= {m.upper() for m in operations}
    return sorted(methods)
