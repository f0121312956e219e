"""The FastAPI application."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from app import errors
from app.routes import admin, ask, console, documents, system
from app.runtime import Runtime
from app.settings import Settings

log = logging.getLogger(__name__)


def create_app(
    settings: Settings | None = None, *, runtime: Runtime | None = None, start_in_background: bool = True
) -> FastAPI:
    """`start_in_background`: answer /healthz at once and /readyz 503 while the model loads."""
    rt = runtime or Runtime(settings or Settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        starter: threading.Thread | None = None
        if not rt.ready:
            if start_in_background:
                starter = threading.Thread(target=_start_quietly, args=(rt,), name="moerag-start", daemon=True)
                starter.start()
            else:
                rt.start()
        try:
            yield
        finally:
            if starter is not None:
                starter.join()
            rt.close()

    app = FastAPI(
        title="moerag",
        version="0.1.0",
        summary="Self-hosted RAG with expert-indexed retrieval",
        lifespan=lifespan,
    )
    app.state.runtime = rt
    errors.install(app)
    app.include_router(system.router)
    app.include_router(documents.router)
    app.include_router(ask.router)
    app.include_router(admin.router)
    app.include_router(console.router)
    app.mount("/admin/static", StaticFiles(directory=console.CONSOLE_DIR / "static"), name="console-static")
    return app


def _start_quietly(rt: Runtime) -> None:
    try:
        rt.start()
    except Exception:  # reported by /readyz; the process stays up instead of crash-looping
        log.exception("moerag failed to start")
