"""moerag for agents: an MCP server on the official `mcp` SDK.

Tools `ask`, `search`, `list_experts` and `get_chunk` answer as `/ask`, `/search`,
`/admin/api/experts` and `/chunks/{id}` do (the same services, checks and query log; `ask` behind
the same per-client rate limit and answer slots as `/ask`, app.services.ratelimit.AnswerGate); the
documents are resources (`moerag://documents`, `moerag://documents/{document_id}`). Served over
stdio by `moerag mcp` and over streamable HTTP at `/mcp` on the server, where the read token
(MOERAG_READ_TOKEN), when set, is required as `Authorization: Bearer`.

Over HTTP every tool and resource answers within what the caller's token may read, as the REST
surfaces do (app.services.tokens): the gate in front of the transport puts the caller in
`_CALLER`, which the SDK's handlers inherit; a handler that finds no caller there refuses. Over
stdio the agent is the operator holding the data dir: the whole store.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any

import anyio
from anyio.abc import TaskGroup, TaskStatus
from pydantic import Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.deps import check_reader, principal
from app.core.errors import ApiError, error_body
from app.schemas.api import INT64_MAX, AskIn, SearchIn
from app.services import library
from app.services.answering import answer_json
from app.services.chat import visible
from app.services.ratelimit import AnswerGate
from app.services.search import run_search
from app.services.tokens import Principal, reach
from engine.errors import MoeragError

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

    from app.runtime import Runtime
    from engine.access import Allowed

PATH = "/mcp"  # where the server mounts the streamable HTTP transport
ChunkId = Annotated[int, Field(ge=0, le=INT64_MAX, description="A chunk's id (search and ask name them).")]
Question = Annotated[str, Field(description="The question, in the user's words (a follow-up made standalone).")]
Query = Annotated[str, Field(description="What to find passages about: a question or keywords.")]
ExpertName = Annotated[
    str | None, Field(description="Ask only this expert: a name from list_experts; omit to let moerag route.")
]
Passages = Annotated[int | None, Field(ge=1, le=50, description="How many passages to cite (default: the expert's).")]
Found = Annotated[int, Field(ge=1, le=50, description="How many passages to return, best first.")]
DOCUMENTS_LISTED = 500  # the `moerag://documents` resource lists the first this many
# Who calls, over HTTP (ReadTokenGate sets it per request; the SDK's tasks inherit it). Unset: no
# gate checked this request, and the handlers refuse rather than answer for the whole store.
_CALLER: ContextVar[Principal] = ContextVar("moerag_mcp_caller")


@contextmanager
def _anticipated(kind: type[Exception]) -> Iterator[None]:
    """moerag's own refusals (unknown ids, limits, not ready) reach the agent as `kind` with their
    code and message; the SDK shows anything else as a bare "Error executing tool"."""
    try:
        yield
    except (ApiError, MoeragError) as exc:
        raise kind(f"{exc.code}: {exc.message}") from None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise kind(f"invalid_request: {problems}") from None


@dataclass(frozen=True)
class _Reads:
    """What every handler asks first: the runtime (ready), who calls, and what they may read."""

    rt: Runtime
    over_http: bool  # each call within its caller's scope (`_CALLER`); else the whole store (stdio)

    def ready(self) -> Runtime:
        if not self.rt.ready:
            raise ApiError("not_ready", f"start-up failed: {self.rt.error}" if self.rt.error else "moerag is starting")
        return self.rt

    def caller(self) -> Principal | None:
        """Who calls (None: the whole store, over stdio); over HTTP, refused if no gate said."""
        if not self.over_http:
            return None
        who = _CALLER.get(None)
        if who is None:
            raise ApiError("unauthorized", "no caller was checked for this request")
        return who

    def allowed(self) -> Allowed | None:
        """What the caller may read in the serving state now (None: everything)."""
        rt = self.ready()
        return reach(rt.tokens, self.caller(), rt.state())

    def expert_id(self, name: str | None, who: Principal | None) -> int | None:
        """The id of the expert named `name` among those `who` may see (one outside the scope is
        as unknown as one that does not exist)."""
        if name is None:
            return None
        found = [i for i, p in visible(self.ready(), who).items() if p.name == name]
        if not found:
            raise ApiError("expert_not_found", f"no expert named {name!r}; list_experts names them")
        return found[0]


def build(rt: Runtime, door: AnswerGate | None = None, over_http: bool = False) -> MCPServer:
    """The MCP server over one runtime (started, or starting: tools wait for nothing and say so);
    `door`: the app's answer gate (none: its own, as `moerag mcp` over stdio has); `over_http`:
    each call answers within its caller's scope (`_CALLER`), else for the whole store (stdio)."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer(
        "moerag",
        instructions="Answers and passages from this team's documents, with citations and the expert "
        "that answered. `ask` for an answer, `search` for passages, `get_chunk` for a passage in context.",
    )
    reads = _Reads(rt, over_http)
    _add_tools(server, reads, door or AnswerGate(None, "", rt.settings.ask_concurrency))  # stdio: no clients
    _add_resources(server, reads)
    return server


def _add_tools(server: MCPServer, reads: _Reads, door: AnswerGate) -> None:
    from mcp.server.mcpserver import Context
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import ToolAnnotations

    # Every tool reads the documents and changes nothing an agent must confirm (a question asked is
    # logged, as on /ask); none reaches outside this knowledge base.
    _READS = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)

    async def ask(question: Question, expert: ExpertName = None, k: Passages = None, ctx: Any = None) -> dict[str, Any]:
        """Answer a question from the documents: the answer with numbered citations [n], the
        passages cited, and the route (the expert that answered, or the whole store, and why).
        `expert`: ask this expert (a name from list_experts); `k`: passages to cite."""
        with _anticipated(ToolError):
            request = ctx.request_context.request if ctx is not None else None
            who = reads.caller()
            await door.check_rate(request if isinstance(request, Request) else None)  # stdio: no client
            body = AskIn(query=question, k=k, mode="expert" if expert else "auto", expert=reads.expert_id(expert, who))
            answered = await anyio.to_thread.run_sync(answer_json, reads.ready(), body, who, limiter=door.slots)
            return json.loads(answered)

    ask.__annotations__["ctx"] = Context  # the SDK finds the parameter it fills by this type
    server.tool(annotations=_READS)(ask)

    @server.tool(annotations=_READS)
    async def search(query: Query, k: Found = 5, expert: ExpertName = None) -> dict[str, Any]:
        """Passages most similar to `query` (ids, documents, scores, text), from the whole store
        or from one expert's clusters (`expert`: a name from list_experts)."""
        with _anticipated(ToolError):
            who = reads.caller()
            rt, eid = reads.ready(), reads.expert_id(expert, who)
            clusters = list(rt.state().experts[eid].clusters) if eid is not None else None
            body = SearchIn(query=query, k=k, clusters=clusters)
            return (await anyio.to_thread.run_sync(run_search, rt, body, who)).model_dump()

    @server.tool(annotations=_READS)
    async def list_experts() -> list[dict[str, Any]]:
        """The experts questions are routed to: id, name and the clusters each owns."""
        with _anticipated(ToolError):
            profiles = visible(reads.ready(), reads.caller())
        return [{"id": p.id, "name": p.name, "clusters": list(p.clusters)} for _, p in sorted(profiles.items())]

    @server.tool(annotations=_READS)
    async def get_chunk(chunk_id: ChunkId) -> dict[str, Any]:
        """One passage in full with its document, heading, expert and the passages before and after it."""
        with _anticipated(ToolError):
            allowed = reads.allowed()
            view = await anyio.to_thread.run_sync(library.chunk_view, reads.rt.sessions, chunk_id, allowed)
        return view.model_dump(mode="json")


def _add_resources(server: MCPServer, reads: _Reads) -> None:
    from mcp.server.mcpserver.exceptions import ResourceNotFoundError

    @server.resource("moerag://documents", mime_type="application/json")
    async def documents() -> str:
        """The stored documents (id, title, source, chunks), the first DOCUMENTS_LISTED by id."""
        with _anticipated(ResourceNotFoundError):
            allowed = reads.allowed()
            page = partial(library.document_page, reads.rt.sessions, 0, DOCUMENTS_LISTED, allowed=allowed)
            _, rows = await anyio.to_thread.run_sync(page)
        listed = [{"id": d.id, "title": d.title, "source": d.source, "chunks": n} for d, n in rows]
        return json.dumps(listed)

    @server.resource("moerag://documents/{document_id}", mime_type="text/plain")
    async def document(document_id: str) -> str:
        """A document's text, its chunks in order."""
        with _anticipated(ResourceNotFoundError):
            if not document_id.isdigit() or int(document_id) > INT64_MAX:
                raise ApiError("not_found", f"no document {document_id[:40]!r}")
            allowed = reads.allowed()
            _, chunks = await anyio.to_thread.run_sync(library.document, reads.rt.sessions, int(document_id), allowed)
        return "\n\n".join(c.text for c in chunks)


class LazyMcp:
    """The streamable HTTP transport, built on the first request to /mcp: the SDK's import (~0.5 s)
    is not paid by every server start. `running()` spans the app's life (its lifespan enters it);
    the session manager runs in its task group from the first request on."""

    def __init__(self, rt: Runtime, door: AnswerGate) -> None:
        self.rt, self.door = rt, door
        self._app: ASGIApp | None = None
        self._lock = anyio.Lock()
        self._tasks: TaskGroup | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            try:
                yield
            finally:
                tasks.cancel_scope.cancel()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._app is None:
            async with self._lock:
                if self._app is None:
                    self._app = await self._build()
        await self._app(scope, receive, send)

    async def _build(self) -> ASGIApp:
        if self._tasks is None:
            raise RuntimeError("the app's lifespan has not started: LazyMcp.running() was not entered")
        await anyio.to_thread.run_sync(importlib.import_module, "mcp.server.mcpserver")  # off the event loop
        from mcp.server.transport_security import TransportSecuritySettings

        server = build(self.rt, self.door, over_http=True)
        app = server.streamable_http_app(
            streamable_http_path=PATH,
            stateless_http=True,  # no session state in one process: any worker of `serve --workers N` answers
            # Host and Origin are not checked: the server may be reached under any name, and the
            # read token guards /mcp as it guards /ask.
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        await self._tasks.start(self._serve, server.session_manager)
        return app

    @staticmethod
    async def _serve(manager: StreamableHTTPSessionManager, *, task_status: TaskStatus[None]) -> None:
        async with manager.run():
            task_status.started()
            await anyio.sleep_forever()


class ReadTokenGate:
    """The HTTP transport behind the read rule of every other read (app.api.deps.check_reader): the
    read token, the admin token, a scoped token (its tools and resources then answer within its
    scope) or a console session when reads are closed; a 401 in moerag's error shape otherwise.
    POST only: the server is stateless and sends nothing unasked, so a GET (a stream for server
    messages, which never came and was never closed) is a 405, as the transport's specification
    allows."""

    def __init__(self, app: ASGIApp, rt: Runtime) -> None:
        self.app, self.rt = app, rt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            request = Request(scope)
            try:
                if request.method != "POST":
                    raise ApiError("method_not_allowed", "the MCP endpoint takes POST only", headers={"Allow": "POST"})
                await check_reader(request, self.rt, request.headers.get("authorization"))
            except ApiError as exc:
                await JSONResponse(error_body(exc.code, exc.message), exc.status, headers=exc.headers)(
                    scope, receive, send
                )
                return
            # The handlers' caller: the SDK runs this request's handlers in tasks started from here.
            caller = _CALLER.set(principal(request))
            try:
                await self.app(scope, receive, send)
            finally:
                _CALLER.reset(caller)
            return
        await self.app(scope, receive, send)
