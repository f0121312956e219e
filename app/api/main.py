"""The FastAPI application."""

from __future__ import annotations

import logging
import re
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from starlette.datastructures import MutableHeaders
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api import mcp_server
from app.api.body_limit import BodyLimit, limit_for
from app.api.deps import optional_read_security
from app.api.routes import admin, ask, console, conversations, documents, openai_compat, system
from app.core import errors
from app.core.limits import state_question_limits
from app.core.settings import Settings
from app.runtime import Runtime, use_serving_threads
from app.schemas.api import ERROR_RESPONSES
from app.services.ratelimit import AnswerGate

log = logging.getLogger(__name__)


def create_app(
    settings: Settings | None = None,
    *,
    runtime: Runtime | None = None,
    start_in_background: bool = True,
    prepare: Callable[[], None] | None = None,
) -> FastAPI:
    """`start_in_background`: answer /healthz at once and /readyz 503 while the model loads.

    prepare: work before the runtime starts (`serve --sample`'s corpus), in the same background
    thread, so the port answers from the first second (/readyz 503 "preparing" meanwhile).
    """
    rt = runtime or Runtime(settings or Settings())
    # the rate limit and the answer slots of every door that answers
    answer_gate = AnswerGate(rt.ask_limiter, rt.settings.trusted_proxies, rt.settings.ask_concurrency)
    agents = mcp_server.LazyMcp(rt, answer_gate)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        starter: threading.Thread | None = None
        use_serving_threads(rt.settings)
        if not rt.ready:
            if start_in_background:
                starter = threading.Thread(target=_start_quietly, args=(rt, prepare), name="moerag-start", daemon=True)
                starter.start()
            else:
                if prepare is not None:
                    prepare()
                rt.start()
        try:
            async with agents.running():  # MCP's session manager, once /mcp is first asked
                yield
        finally:
            if starter is not None:
                starter.join()
            rt.close()

    # Swagger UI and ReDoc from files shipped in the fastapi-offline package: no CDN, so /docs
    # and /redoc work on a closed network.
    app = FastAPIOffline(
        title="moerag",
        version="0.1.0",
        summary="Self-hosted RAG with expert-indexed retrieval",
        lifespan=lifespan,
        static_url="/docs-static",
    )
    app.state.runtime = rt
    app.state.answer_gate = answer_gate
    build_spec = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = optional_read_security(state_question_limits(build_spec(), rt.settings))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    errors.install(app)
    app.add_middleware(SecurityHeaders)
    app.add_middleware(BodyLimit, limit=limit_for(rt.settings))
    app.include_router(system.router, responses=ERROR_RESPONSES)
    app.include_router(documents.router, responses=ERROR_RESPONSES)
    app.include_router(ask.router, responses=ERROR_RESPONSES)
    app.include_router(openai_compat.router, responses=ERROR_RESPONSES)
    app.include_router(conversations.router, responses=ERROR_RESPONSES)
    app.include_router(admin.router, responses=ERROR_RESPONSES)
    app.include_router(console.router)
    app.router.routes.append(Route(mcp_server.PATH, endpoint=mcp_server.ReadTokenGate(agents, rt)))
    app.mount("/admin/static", StaticFiles(directory=console.CONSOLE_DIR / "static"), name="console-static")
    return app


# The console's pages: its own script and styles only (inline style attributes are drawn by
# console.js), no framing, no sniffing, no referrer to other sites.
CONSOLE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


# The API docs pages (Swagger UI, ReDoc): their inline start-up scripts, nothing from elsewhere
# (ReDoc's footer would fetch its logo from a CDN; blocked here, the page stays fully offline).
DOCS_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' "
    "'unsafe-inline'; img-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
}


class SecurityHeaders:
    """Pure ASGI (no task group around the app): the console's and the docs' headers, nosniff everywhere,
    and `X-Request-Id` on every response: the client's own (echoed) or a fresh one, so a client can
    tell that a response, an error above all, answers its request and no other."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path == "/admin" or path.startswith("/admin/"):
            extra = CONSOLE_HEADERS
        elif path in ("/docs", "/redoc"):
            extra = DOCS_HEADERS
        else:
            extra = {"X-Content-Type-Options": "nosniff"}

        request_id = _request_id(scope)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in extra.items():
                    headers[name] = value
                headers["X-Request-Id"] = request_id
            await send(message)

        await self.app(scope, receive, send_with_headers)


_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def _request_id(scope: Scope) -> str:
    """The request's X-Request-Id when it is a plain token (echoed), else a new random one."""
    for name, value in scope.get("headers") or ():
        if name == b"x-request-id":
            given = value.decode("latin-1")
            if _REQUEST_ID.fullmatch(given):
                return given
    return uuid.uuid4().hex


def worker_app() -> FastAPI:
    """The app of one `moerag serve --workers N` worker (uvicorn's factory) or of one ingress
    replica on Ray Serve (app.shards.ingress.deploy): settings from the environment the supervisor
    or `moerag ray up` prepared.

    It starts before it serves: the workers share one socket, and a worker that accepted
    connections while loading would answer them 503 while its siblings were ready (measured:
    232 of the first requests against 4 workers); starting in the lifespan, it does not accept
    until ready, and the kernel hands connections to the ready ones.

    A worker dies with its supervisor (app.api.worker, its entry, sees to it before this module
    loads): a killed supervisor left its workers serving as orphans, the port taken and the data
    dir's lock free."""
    return create_app(Settings(), start_in_background=False)


def _start_quietly(rt: Runtime, prepare: Callable[[], None] | None = None) -> None:
    try:
        if prepare is not None:
            rt.phase = "preparing"
            prepare()
            rt.phase = "starting"
        rt.start()
    except Exception:  # reported by /readyz; the process stays up instead of crash-looping
        log.exception("moerag failed to start")
