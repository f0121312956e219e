"""Request bodies held to a per-route limit before they are buffered: early 413, chunked bodies too.

A declared Content-Length over the limit is refused before a byte is read; a chunked body is
counted as it arrives and refused the moment it passes the limit, so a 500 MB body to /ask
never sits in memory. (Starlette's RequestBodyLimitMiddleware does the counting too, but
answers in plain text; every moerag error is the JSON {"error": {"code", "message"}}.)
"""

from __future__ import annotations

import json
from collections.abc import Callable

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.settings import Settings

LimitFor = Callable[[str], int]  # path -> the largest body accepted there, in bytes
MULTIPART_SLACK = 64 * 1024  # an upload's multipart framing, beyond the file's own limit


def limit_for(settings: Settings) -> LimitFor:
    """Documents may be as large as an upload (a bulk request, that many uploads); any other body is small.

    The one place request sizes are refused before reading: the upload routes then hold each
    file (or JSON text) to MOERAG_MAX_UPLOAD_BYTES as they read it.
    """

    def limit(path: str) -> int:
        if path == "/documents/bulk":
            return settings.max_upload_bytes * settings.max_bulk_files
        if path == "/documents" or path.startswith("/documents/"):
            return settings.max_upload_bytes + MULTIPART_SLACK
        return settings.max_request_bytes

    return limit


class BodyLimit:
    def __init__(self, app: ASGIApp, limit: LimitFor) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit(scope["path"])
        declared = dict(scope.get("headers") or []).get(b"content-length", b"").decode("latin-1")
        if declared.isdigit() and int(declared) > limit:
            await _refuse(send, f"the request body is {declared} bytes; the limit here is {limit}")
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:  # FastAPI lets its own HTTPException through body parsing
                    raise HTTPException(413, f"the request body passed the limit of {limit} bytes")
            return message

        await self.app(scope, counted, send)


async def _refuse(send: Send, message: str) -> None:
    body = json.dumps({"error": {"code": "too_large", "message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 413, "headers": [*headers, (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
