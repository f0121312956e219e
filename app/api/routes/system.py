"""Health, readiness, stats, jobs and search."""

from __future__ import annotations

import os

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, RedirectResponse
from starlette.concurrency import run_in_threadpool

from app.api.deps import (
    IdPath,
    Limit,
    Offset,
    ReaderDep,
    RuntimeDep,
    check_reader,
    principal,
    refuse_scoped,
)
from app.core.errors import ApiError
from app.runtime import Runtime
from app.schemas.api import PAGE_DEFAULT, JobOut, Page, SearchIn, SearchOut, ShardVectorsOut, StatsOut
from app.services.search import run_search
from app.services.tokens import reach

router = APIRouter()


@router.get("/", include_in_schema=False)
def root() -> RedirectResponse:
    """A browser at the server's address lands on the console (the API's docs are at /docs)."""
    return RedirectResponse("/admin", status_code=307)


@router.get("/healthz", tags=["system"])
def healthz() -> dict[str, str]:
    """The process is alive (it may still be loading)."""
    return {"status": "ok"}


@router.get("/readyz", tags=["system"])
async def readyz(request: Request) -> JSONResponse:
    """Model, database and index loaded: 200; otherwise 503 with what is missing. Readiness is open;
    the details (the index, the router's staleness with the documents it names) are a read, behind
    MOERAG_READ_TOKEN where it is set."""
    rt: Runtime = request.app.state.runtime
    if not rt.ready:
        body = {"status": "failed" if rt.error else rt.phase, "error": rt.error}
        return JSONResponse(body, 503, headers={"Retry-After": "2"})
    status = _status(rt)
    try:
        await check_reader(request, rt, request.headers.get("authorization"))
        refuse_scoped(request)  # the details name shards and counts over the whole store
    except ApiError:
        return JSONResponse({"status": status, "pid": os.getpid()})
    return JSONResponse(await run_in_threadpool(_details, rt) | {"status": status})


def _status(rt: Runtime) -> str:
    """ "ready", or "degraded" while an expert shard's breaker is open or Ray is out of reach (answers
    are partial then: the shards it names in `shards` are skipped until a probe finds them back)."""
    health = rt.shard_health() or []
    return "degraded" if any(row["breaker"] != "closed" or row["ray"] != "connected" for row in health) else "ready"


def _details(rt: Runtime) -> dict[str, object]:
    idx = rt.indexes.index
    return {
        "status": "ready",
        "pid": os.getpid(),  # which process answered (several workers share one port)
        "model": {"name": rt.embedder.name, "dim": rt.embedder.dim, "dtype": rt.embedder.dtype_name},
        "database": rt.engine.dialect.name,
        "kernels": rt.kernel_backend,
        "scoped_kernel": rt.scoped_kernel,  # the split kernel, or why the serial one answers
        "index": {
            "version": idx.version,
            "clusters": idx.nlist,
            "vectors": idx.ntotal,
            "codec": idx.codec,  # none: the vectors live on the expert shards (MOERAG_SHARD_MAP)
            "opened": rt.index_status,
        },
        "router": rt.routers.staleness(),  # stale: the mapping changed since it was trained
        "catalogue_version": rt.catalogue.version,  # the last change this process applied
        # what a question starting now reads (app.serving.states), and what building it took
        "serving": rt.state().versions | {"build_ms": rt.services.states.build_ms},
        "question_model": rt.question_model,
        **({"shards": health} if (health := rt.shard_health()) is not None else {}),
    }


@router.get("/stats", response_model=StatsOut, tags=["system"], dependencies=[ReaderDep])
def stats(rt: RuntimeDep, request: Request) -> StatsOut:
    """The store's figures; a scoped token's are those of what it may read (its documents, their
    chunks and vectors, the lists holding them), and nothing of the rest."""
    state = rt.state()
    allowed = reach(rt.tokens, principal(request), state)
    if allowed is not None:
        chunks = len(allowed.ids)
        clusters = len(allowed.lists_in(state.index))
        return StatsOut(documents=len(allowed.documents), chunks=chunks, clusters=clusters, index_vectors=chunks)
    tier = rt.services.states.shards
    shards = None if tier is None else [ShardVectorsOut.model_validate(row) for row in tier.overview()]
    return StatsOut(**rt.stats(), shards=shards)


@router.get("/jobs", response_model=Page[JobOut], tags=["jobs"], dependencies=[ReaderDep])
def list_jobs(request: Request, rt: RuntimeDep, offset: Offset = 0, limit: Limit = PAGE_DEFAULT) -> Page[JobOut]:
    """Jobs, newest first; a scoped token's own only (its bulk uploads)."""
    total, rows = rt.jobs.recent(offset, limit, principal(request).owner)
    return Page(items=[JobOut.model_validate(j) for j in rows], total=total, offset=offset, limit=limit)


@router.get("/jobs/{job_id:int}", response_model=JobOut, tags=["jobs"], dependencies=[ReaderDep])
def get_job(job_id: IdPath, request: Request, rt: RuntimeDep) -> JobOut:
    """One job; another token's is not found to a scoped token."""
    return JobOut.model_validate(rt.jobs.get(job_id, principal(request).owner))


@router.post("/search", response_model=SearchOut, tags=["search"], dependencies=[ReaderDep])
async def search_chunks(body: SearchIn, request: Request, rt: RuntimeDep) -> SearchOut:
    """Dense retrieval: every cluster (exact) or only the given clusters, within what the caller may read."""
    return await run_in_threadpool(run_search, rt, body, principal(request))
