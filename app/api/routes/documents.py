from __future__ import annotations

import shutil
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from app.api.deps import IdPath, Limit, Offset, ReaderDep, RuntimeDep, WriterDep, principal
from app.api.routes.uploads import form_fields, read_upload_file, upload_from_request
from app.core.errors import ApiError
from app.core.models import Document
from app.schemas.api import (
    NAME_MAX,
    PAGE_DEFAULT,
    ChunkOut,
    ChunkSummary,
    DeletedOut,
    DocumentDetail,
    DocumentOut,
    DocumentPage,
    FileFields,
    IngestOut,
    JobOut,
    TagFields,
    TextDocumentIn,
)
from app.services import library
from app.services.bulk import new_spool, spool_file
from app.services.documents import refuse_outside
from app.services.tokens import reach

router = APIRouter(tags=["documents"])


def _multipart_body(required: str, properties: dict[str, Any], other: dict[str, Any] | None = None) -> dict[str, Any]:
    """An `openapi_extra` request body: a strict multipart form (and `other` media types by name)."""
    form = {"type": "object", "required": [required], "properties": properties, "additionalProperties": False}
    content = {"multipart/form-data": {"schema": form}, **(other or {})}
    return {"requestBody": {"required": True, "content": content}}


_UPLOAD_BODY = _multipart_body(
    "file",
    {
        "file": {"type": "string", "format": "binary"},
        **{name: {"type": "string", "maxLength": NAME_MAX} for name in FileFields.model_fields},
    },
    {"application/json": {"schema": TextDocumentIn.model_json_schema()}},
)


def _out(doc: Document, n_chunks: int) -> DocumentOut:
    return DocumentOut(
        id=doc.id,
        source=doc.source,
        title=doc.title,
        mime=doc.mime,
        size=doc.size,
        status=doc.status,
        chunks=n_chunks,
        metadata=doc.meta or {},
        content_hash=doc.content_hash,
        created_at=doc.created_at,
        updated_at=doc.updated_at,
    )


@router.post(
    "/documents",
    response_model=IngestOut,
    status_code=201,
    dependencies=[WriterDep],
    openapi_extra=_UPLOAD_BODY,
    responses={200: {"model": IngestOut, "description": "The same bytes were already stored: that document."}},
)
async def create_document(request: Request, response: Response, rt: RuntimeDep) -> IngestOut:
    """Ingest one document (multipart `file` of txt/md/html/pdf/docx/pptx/xlsx/odt, or JSON text).
    Same bytes -> same id. A write token's document must lie in its scope (tags or source prefix)."""
    upload = await upload_from_request(request, rt.settings.max_upload_bytes)
    outcome = await run_in_threadpool(rt.ingestor.ingest, upload, principal(request).scope)
    if outcome.status == "duplicate":
        response.status_code = 200
    assert outcome.document_id is not None
    return IngestOut(
        id=outcome.document_id,
        source=outcome.source,
        chunks=outcome.chunks,
        status=outcome.status,
    )


_BULK_BODY = _multipart_body(
    "files",
    {
        "files": {"type": "array", "minItems": 1, "items": {"type": "string", "format": "binary"}},
        "tags": {"type": "string", "maxLength": NAME_MAX},
    },
)


@router.post(
    "/documents/bulk", response_model=JobOut, status_code=202, dependencies=[WriterDep], openapi_extra=_BULK_BODY
)
async def bulk_ingest(request: Request, rt: RuntimeDep) -> JobOut:
    """Many files in multipart fields named `files` (their file names their sources; `tags`,
    comma-separated, the tags of each): spooled to disk, then ingested by a job. A write token's
    files must all lie in its scope, or none is taken; the job is its own."""
    who = principal(request)
    s = rt.settings
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "multipart/form-data":
        raise ApiError("unsupported_media_type", "send multipart/form-data with one or more 'files' fields")
    form = await request.form(max_files=s.max_bulk_files, max_fields=s.max_bulk_files + 10)
    uploads = [f for f in form.getlist("files") if isinstance(f, UploadFile)]
    if not uploads:
        raise ApiError("missing_file", "send the documents in multipart fields named 'files'")
    meta = form_fields(form, "files", TagFields).metadata
    names = [f.filename or f"upload-{i}" for i, f in enumerate(uploads)]
    for name in names:  # before anything is spooled
        refuse_outside(who.scope, name, meta, named=repr(name))
    spool = new_spool(s.spool_dir)
    files = []
    try:
        for i, (f, name) in enumerate(zip(uploads, names, strict=True)):
            data = await read_upload_file(f, s.max_upload_bytes)
            path = spool_file(spool, i, name, data)
            files.append(
                {"path": str(path), "filename": name, "source": name, "content_type": f.content_type, "metadata": meta}
            )
        scope = who.scope.as_json() if who.scope is not None else None  # the job writes within it
        params = {"files": files, "spool": str(spool), "scope": scope}
        job = rt.jobs.submit("ingest", params, total=len(files), owner=who.owner)
    except BaseException:  # a refused upload or a full job queue keeps none of the spooled files
        shutil.rmtree(spool, ignore_errors=True)
        raise
    return JobOut.model_validate(job)


@router.get("/documents", response_model=DocumentPage, dependencies=[ReaderDep])
def list_documents(
    rt: RuntimeDep,
    request: Request,
    offset: Offset = 0,
    limit: Limit = PAGE_DEFAULT,
    q: Annotated[
        str | None, Query(max_length=200, description="Only documents whose title, source or text contains this.")
    ] = None,
) -> DocumentPage:
    allowed = reach(rt.tokens, principal(request), rt.state())  # a scoped token lists its documents only
    total, rows = library.document_page(rt.sessions, offset, limit, q, allowed)
    items = [_out(doc, n) for doc, n in rows]
    return DocumentPage(items=items, total=total, offset=offset, limit=limit)


@router.get("/documents/{document_id:int}", response_model=DocumentDetail, dependencies=[ReaderDep])
def get_document(document_id: IdPath, request: Request, rt: RuntimeDep) -> DocumentDetail:
    doc, chunks = library.document(rt.sessions, document_id, reach(rt.tokens, principal(request), rt.state()))
    summaries = [ChunkSummary.model_validate(c) for c in chunks]
    return DocumentDetail(**_out(doc, len(summaries)).model_dump(), chunk_list=summaries)


@router.put(
    "/documents/{document_id:int}", response_model=IngestOut, dependencies=[WriterDep], openapi_extra=_UPLOAD_BODY
)
async def replace_document(document_id: IdPath, request: Request, rt: RuntimeDep) -> IngestOut:
    """New content for an existing document; its id stays, its chunks are replaced (a write token's:
    a document of its scope, kept in it)."""
    upload = await upload_from_request(request, rt.settings.max_upload_bytes)
    outcome = await run_in_threadpool(rt.ingestor.update, document_id, upload, principal(request).scope)
    return IngestOut(id=document_id, source=outcome.source, chunks=outcome.chunks, status=outcome.status)


@router.delete("/documents/{document_id:int}", response_model=DeletedOut, dependencies=[WriterDep])
def delete_document(document_id: IdPath, request: Request, rt: RuntimeDep) -> DeletedOut:
    """Delete a document and its chunks (a write token: one of its scope)."""
    n = rt.ingestor.delete(document_id, principal(request).scope)
    return DeletedOut(id=document_id, deleted=True, chunks=n)


@router.get("/chunks/{chunk_id:int}", response_model=ChunkOut, dependencies=[ReaderDep])
def get_chunk(chunk_id: IdPath, request: Request, rt: RuntimeDep) -> ChunkOut:
    """One chunk in full, where it sits (document, heading path, expert) and its neighbours."""
    return library.chunk_view(rt.sessions, chunk_id, reach(rt.tokens, principal(request), rt.state()))
