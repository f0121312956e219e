"""Turn a request (multipart `file` or JSON text) into an Upload, enforcing the size limit."""

from __future__ import annotations

import hashlib
import json
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.datastructures import FormData, UploadFile

from app.core.errors import ApiError
from app.schemas.api import NAME_MAX, FileFields, TextDocumentIn
from app.services.documents import Upload

M = TypeVar("M", bound=BaseModel)
_FORMAT_TYPES = {"txt": "text/plain", "md": "text/markdown", "html": "text/html"}


async def read_upload_file(file: UploadFile, limit: int) -> bytes:
    data = bytearray()
    while block := await file.read(1 << 20):
        data += block
        if len(data) > limit:
            raise ApiError("too_large", f"{file.filename or 'the upload'} exceeds the limit of {limit} bytes")
    return bytes(data)


async def upload_from_request(request: Request, limit: int) -> Upload:
    # The body as a whole was held to the route's limit as it arrived (app/api/body_limit.py); the
    # file itself is held to `limit` here.
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype == "multipart/form-data":
        form = await request.form(max_files=1, max_fields=10)
        file = form.get("file")
        if not isinstance(file, UploadFile):
            raise ApiError("missing_file", "send the document in a multipart field named 'file'")
        fields = form_fields(form, "file", FileFields)
        data = await read_upload_file(file, limit)
        filename = file.filename or "upload"
        return Upload(
            data=data,
            source=_blank_is_none(fields.source) or filename[:NAME_MAX],
            filename=filename,
            title=_blank_is_none(fields.title),
            content_type=file.content_type,
            metadata=fields.metadata,
        )
    if ctype in ("application/json", ""):
        body = await request.body()
        if len(body) > limit:
            raise ApiError("too_large", f"the request exceeds the limit of {limit} bytes")
        try:
            payload: Any = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ApiError("malformed_json", "the request body is not valid JSON") from None
        try:
            doc = TextDocumentIn.model_validate(payload)
        except ValidationError as exc:
            raise ApiError("invalid_request", _reasons(exc)) from None
        data = doc.text.encode("utf-8")
        source = doc.source or f"text:{hashlib.sha256(data).hexdigest()[:12]}"
        return Upload(
            data=data,
            source=source,
            filename=None,
            title=doc.title,
            content_type=_FORMAT_TYPES[doc.format],
            metadata=doc.metadata,
        )
    raise ApiError("unsupported_media_type", "send multipart/form-data with a 'file' field, or JSON text")


def _blank_is_none(value: str | None) -> str | None:
    return value.strip() or None if value is not None else None


def form_fields(form: FormData, files: str, model: type[M]) -> M:
    """A multipart form's text fields, checked by `model` (unknown names, lengths): each sent
    once, as text. `files` names the field that carries the upload(s)."""
    values: dict[str, list[Any]] = {}
    for key, value in form.multi_items():
        if key != files:
            values.setdefault(key, []).append(value)
    for key, sent in values.items():
        if len(sent) > 1 or not isinstance(sent[0], str):
            raise ApiError("invalid_request", f"form field {key!r} must be sent once, as text")
    try:
        return model.model_validate({key: sent[0] for key, sent in values.items()})
    except ValidationError as exc:
        raise ApiError("invalid_request", _reasons(exc)) from None


def _reasons(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
