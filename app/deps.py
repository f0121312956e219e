"""Dependency aliases, defined once: the runtime (503 until ready) and the admin check."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from app.auth import token_matches
from app.errors import ApiError
from app.runtime import Runtime


def get_runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    if not rt.ready:
        message = f"start-up failed: {rt.error}" if rt.error else "moerag is starting (loading model and index)"
        raise ApiError(503, "not_ready", message, headers={"Retry-After": "2"})
    return rt


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


def require_admin(rt: RuntimeDep, authorization: Annotated[str | None, Header()] = None) -> None:
    if not token_matches(rt.admin_token, authorization):
        raise ApiError(
            401,
            "unauthorized",
            "this endpoint needs the admin token: Authorization: Bearer <token>",
            headers={"WWW-Authenticate": "Bearer"},
        )


AdminDep = Depends(require_admin)
