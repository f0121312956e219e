"""Dependency aliases, defined once: the runtime (503 until ready) and the admin check."""

from __future__ import annotations

import hmac
from typing import Annotated, Any

from fastapi import Depends, Header, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from app.core.auth import SESSION_COOKIE, csrf_token, token_matches
from app.core.errors import ApiError
from app.runtime import Runtime
from app.schemas.api import INT64_MAX, PAGE_LIMIT
from app.services.tokens import ADMIN, EVERYONE, READER, TOKEN_PREFIX, Principal


# Dependencies that do no I/O are `async def`: FastAPI runs a plain `def` dependency in the
# thread pool, a hop that cost /ask ~3% of its GIL time under load (py-spy --gil, 8 clients).
async def get_runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    if not rt.ready:
        message = f"start-up failed: {rt.error}" if rt.error else "moerag is starting (loading model and index)"
        raise ApiError("not_ready", message, headers={"Retry-After": "2"})
    return rt


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
IdPath = Annotated[int, Path(ge=0, le=INT64_MAX)]  # an id in a URL: beyond int64 it is a 422, not a 500
Offset = Annotated[int, Query(ge=0, le=INT64_MAX, description="Items to skip (every list pages the same way).")]
Limit = Annotated[int, Query(ge=1, le=PAGE_LIMIT, description="Items on one page.")]

SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}
# Declares the bearer scheme in the OpenAPI spec; the checks below decide (a console session may stand in).
bearer = HTTPBearer(
    auto_error=False,
    description="The admin token (writes; a write token for documents within its scope), or MOERAG_READ_TOKEN "
    "where reads are closed.",
)
Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def _authorization(credentials: HTTPAuthorizationCredentials | None) -> str | None:
    return f"Bearer {credentials.credentials}" if credentials is not None else None


def require_admin(
    request: Request,
    rt: RuntimeDep,
    credentials: Bearer,
    x_csrf_token: Annotated[str | None, Header()] = None,
) -> None:
    """The bearer token (or a scoped token with the admin role), or a console session cookie (plus
    its CSRF header on state changes)."""
    _granted(request, rt, credentials, x_csrf_token, "admin")


AdminDep = Depends(require_admin)


def require_writer(
    request: Request,
    rt: RuntimeDep,
    credentials: Bearer,
    x_csrf_token: Annotated[str | None, Header()] = None,
) -> None:
    """A document write: the admin (the whole store), or a token with the write role, kept on the
    request (`principal`) so the write stays within its scope."""
    request.state.principal = _granted(request, rt, credentials, x_csrf_token, "write")


def _granted(
    request: Request, rt: Runtime, credentials: HTTPAuthorizationCredentials | None, csrf: str | None, role: str
) -> Principal:
    """Who may act with `role` ("admin" or "write"): the admin token, a named token of that role or
    above (looked up once), or a console session (with its CSRF header on state changes)."""
    if token_matches(rt.admin_token, _authorization(credentials)):
        return ADMIN
    if credentials is not None and credentials.credentials.startswith(TOKEN_PREFIX):
        named = rt.tokens.resolve(credentials.credentials)
        if named is not None and named.may(role):
            return ADMIN if named.role == "admin" else named
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie is not None and rt.console_sessions.valid(rt.admin_token, cookie):
        if request.method in SAFE_METHODS:
            return ADMIN
        if csrf and hmac.compare_digest(csrf, csrf_token(rt.admin_token, cookie)):
            return ADMIN
        raise ApiError("csrf", "missing or wrong X-CSRF-Token header for this session")
    raise ApiError(
        "unauthorized",
        "this endpoint needs the admin token: Authorization: Bearer <token>",
        headers={"WWW-Authenticate": "Bearer"},
    )


WriterDep = Depends(require_writer)


# Reads declare their own scheme, so the spec can say the token is optional there (see optional_read_security).
read_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="ReadToken",
    description="Reads are open by default; where MOERAG_READ_TOKEN is set, that token or the admin token.",
)
ReadBearer = Annotated[HTTPAuthorizationCredentials | None, Depends(read_bearer)]


def optional_read_security(spec: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI spec with the read token optional on reads (`security: [{}, {"ReadToken": []}]`):
    they answer without it unless MOERAG_READ_TOKEN is set, and the spec must not claim otherwise."""
    for operations in spec.get("paths", {}).values():
        for op in operations.values():
            if isinstance(op, dict) and op.get("security") == [{"ReadToken": []}]:
                op["security"] = [{}, {"ReadToken": []}]
    return spec


async def require_reader(request: Request, rt: RuntimeDep, credentials: ReadBearer) -> None:
    """Reads are open unless MOERAG_READ_TOKEN is set or a scoped token exists; then the read token,
    the admin token, a scoped token or a console session. Who is reading (and what they may read)
    is kept on the request for the route (`principal`)."""
    await check_reader(request, rt, _authorization(credentials))


async def check_reader(request: Request, rt: Runtime, authorization: str | None) -> None:
    """`require_reader`'s rule for any request (the /mcp transport, outside FastAPI's dependencies)."""
    request.state.principal = await reader(request, rt, authorization)


async def reader(request: Request, rt: Runtime, authorization: str | None) -> Principal:
    """Who reads: a scoped token is looked up in SQL on every request (a revocation holds from the
    next one); with no token, everyone reads the whole store only where nothing closes reads."""
    if token_matches(rt.admin_token, authorization):
        return ADMIN
    configured = rt.settings.read_token
    if configured is not None and token_matches(configured.get_secret_value(), authorization):
        return READER
    given = authorization.removeprefix("Bearer ").strip() if authorization else ""
    if given.startswith(TOKEN_PREFIX):
        named = await run_in_threadpool(rt.tokens.resolve, given)
        if named is None:
            raise ApiError(
                "unauthorized", "this token is unknown, revoked or expired", headers={"WWW-Authenticate": "Bearer"}
            )
        return named
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie is not None and await run_in_threadpool(rt.console_sessions.valid, rt.admin_token, cookie):
        return ADMIN
    if configured is None:  # open reads (any other bearer is a client's placeholder) unless a scoped token exists
        closed = rt.tokens.reads_closed()
        if closed is None:
            closed = await run_in_threadpool(rt.tokens.refresh_reads_closed)
        if not closed:
            return EVERYONE
    raise ApiError(
        "unauthorized",
        "reads need a token here (MOERAG_READ_TOKEN or scoped tokens are set): Authorization: Bearer <token>",
        headers={"WWW-Authenticate": "Bearer"},
    )


async def require_whole_reader(request: Request, rt: RuntimeDep, credentials: ReadBearer) -> None:
    """A read that is not limited to a scope yet: `require_reader`, and a scoped token refused
    (deny by default) rather than shown what lies outside its scope."""
    await check_reader(request, rt, _authorization(credentials))
    refuse_scoped(request)


def refuse_scoped(request: Request) -> None:
    if principal(request).scope is not None:
        raise ApiError("scoped_token", "this endpoint answers for the whole store: a scoped token may not read it")


WholeReaderDep = Depends(require_whole_reader)


def principal(request: Request) -> Principal:
    """Who is reading this request (`require_reader` set it; the whole store otherwise)."""
    return getattr(request.state, "principal", EVERYONE)


ReaderDep = Depends(require_reader)
