"""Every error leaves as JSON: {"error": {"code", "message"}} with a fitting 4xx/5xx status."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import IntegrityError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.services.documents import Conflict, NotFound
from app.services.routing import NotTrainable
from engine.errors import InputError


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **extra}}


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(error_body(exc.code, exc.message), exc.status, headers=exc.headers)

    @app.exception_handler(InputError)
    async def _input(_: Request, exc: InputError) -> JSONResponse:
        return JSONResponse(error_body(exc.code, exc.message), exc.status)

    @app.exception_handler(NotFound)
    async def _missing(_: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse(error_body("not_found", str(exc)), 404)

    @app.exception_handler(NotTrainable)
    async def _untrainable(_: Request, exc: NotTrainable) -> JSONResponse:
        return JSONResponse(error_body("not_trainable", str(exc)), 409)

    @app.exception_handler(Conflict)
    async def _conflict(_: Request, exc: Conflict) -> JSONResponse:
        return JSONResponse(error_body("conflict", str(exc)), 409)

    @app.exception_handler(IntegrityError)
    async def _integrity(_: Request, exc: IntegrityError) -> JSONResponse:
        # A row the request refers to went away (or appeared) in a concurrent change.
        return JSONResponse(error_body("conflict", "a concurrent change got there first; read and retry"), 409)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return JSONResponse(error_body("malformed_json", "the request body is not valid JSON"), 400)
        details = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "")} for e in errors]
        return JSONResponse(error_body("invalid_request", "the request is not valid", details=details), 422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized", 413: "too_large"}.get(
            exc.status_code, "http_error"
        )
        return JSONResponse(error_body(code, str(exc.detail)), exc.status_code, headers=exc.headers)
