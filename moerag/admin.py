"""The operator's calls of moerag's API (experts, clusters, router, sources, conversations),
typed, for `moerag.client.Client` and `moerag.client.AsyncClient` alike: each is one request,
written once here as a `Call` (what to send, what to return of the answer), and the ones that
start a job wait for it unless `wait=False`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from moerag.types import Job, Json, Progress

PAGE = 500  # items a listing asks for at once


@dataclass(frozen=True)
class Call:
    """One request of the API: its method, path, accepted statuses and httpx arguments; `then`
    maps the decoded answer to what the call returns; `job`: the answer is a job to wait for."""

    method: str
    path: str
    ok: tuple[int, ...] = (200,)
    kw: dict[str, Any] = field(default_factory=dict)
    then: Callable[[Any], Any] | None = None
    job: bool = False


class OperatorCalls:
    """The calls, each returning the `Call` it makes (no I/O): `AdminCalls` and `AsyncAdminCalls`
    send them."""

    # ---- experts and their lists -------------------------------------------------------------------

    @staticmethod
    def experts() -> Call:
        return Call("GET", "/admin/api/experts", kw={"params": {"limit": 500}}, then=lambda r: r["items"])

    @staticmethod
    def create_expert(name: str, **fields: Any) -> Call:
        """A new expert (fields: description, system_prompt, generator, top_k, threshold)."""
        return Call("POST", "/admin/api/experts", (201,), {"json": {"name": name, **fields}})

    @staticmethod
    def define_expert(
        expert_id: int, ids: list[int] | None = None, source_prefix: str | None = None, tag: str | None = None
    ) -> Call:
        """Define an expert by documents (ids, a source folder, a tag): a job gives it lists of
        exactly their chunks and retrains the router."""
        body = {k: v for k, v in (("ids", ids), ("source_prefix", source_prefix), ("tag", tag)) if v}
        return Call("PUT", f"/admin/api/experts/{expert_id}/documents", (202,), {"json": body}, job=True)

    @staticmethod
    def clusters(expert_id: int | None = None) -> Call:
        """The IVF lists (size, keywords, expert), all or one expert's."""

        def mine(r: Any) -> list[Json]:
            items: list[Json] = r["items"]
            return items if expert_id is None else [c for c in items if c["expert_id"] == expert_id]

        return Call("GET", "/admin/api/clusters", kw={"params": {"limit": PAGE}}, then=mine)

    @staticmethod
    def map_clusters(cluster_ids: list[int], expert_id: int | None) -> Call:
        """Give lists to an expert (None: unmap them); the shards and router follow."""
        return Call(
            "POST", "/admin/api/clusters/assign", kw={"json": {"cluster_ids": cluster_ids, "expert_id": expert_id}}
        )

    @staticmethod
    def propose_experts(n: int = 6, apply: bool = False, keep_mapped: bool = True, **fields: Any) -> Call:
        """Group the lists into `n` experts by centroid: the proposal and its diff (`apply`: made so)."""
        body = {"n": n, "apply": apply, "keep_mapped": keep_mapped, **fields}
        return Call("POST", "/admin/api/experts/propose", kw={"json": body})

    @staticmethod
    def refit(experts: int | None = None, apply: bool = False, delete_emptied: bool = True) -> Call:
        """Re-fit the experts to the content (recluster, propose, accept, retrain); without `apply`
        the job's result is the plan only."""
        body = {"experts": experts, "apply": apply, "delete_emptied": delete_emptied}
        return Call("POST", "/admin/api/experts/refit", (202,), {"json": body}, job=True)

    @staticmethod
    def delete_expert(expert_id: int) -> Call:
        return Call("DELETE", f"/admin/api/experts/{expert_id}", (200, 204), then=lambda r: None)

    # ---- router, questions ----------------------------------------------------------------------------

    @staticmethod
    def train_router(activate: bool = True) -> Call:
        return Call("POST", "/admin/api/router/train", (202,), {"json": {"activate": activate}}, job=True)

    @staticmethod
    def router_versions() -> Call:
        return Call("GET", "/admin/api/router/versions", kw={"params": {"limit": 500}}, then=lambda r: r["items"])

    @staticmethod
    def activate_router(version_id: int) -> Call:
        return Call("POST", f"/admin/api/router/versions/{version_id}/activate")

    @staticmethod
    def recluster(clusters: int | None = None) -> Call:
        return Call("POST", "/admin/api/recluster", (202,), {"json": {"clusters": clusters}}, job=True)

    # ---- sources ---------------------------------------------------------------------------------------

    @staticmethod
    def sync(
        folder: str | None = None,
        git: str | None = None,
        branch: str | None = None,
        site: str | None = None,
        max_pages: int = 200,
        max_depth: int = 5,
    ) -> Call:
        """Mirror one source on the server: a folder under MOERAG_SYNC_ROOTS, or a git repository
        (`branch`) or a web site (a start page or its sitemap; `max_pages`, `max_depth`) under
        MOERAG_SYNC_URLS; the job's result: the counts."""
        body: Json = {"folder": folder} if folder else {"git": git, "branch": branch} if git else {}
        if site:
            body = {"site": site, "max_pages": max_pages, "max_depth": max_depth}
        return Call("POST", "/admin/api/sync", (202,), {"json": body}, job=True)

    @staticmethod
    def questions(offset: int = 0, limit: int = 50) -> Call:
        """A page of the questions asked, newest first, each with its route."""
        return Call("GET", "/admin/api/questions", kw={"params": {"offset": offset, "limit": limit}})

    @staticmethod
    def label_question(query_id: int, expert_id: int | None) -> Call:
        """The right expert for a question asked (None: none of them); the next training uses it."""
        return Call("POST", f"/admin/api/questions/{query_id}/label", kw={"json": {"expert_id": expert_id}})

    # ---- documents and conversations ---------------------------------------------------------------

    @staticmethod
    def documents(offset: int = 0, limit: int = 50, q: str | None = None) -> Call:
        params = {"offset": offset, "limit": limit, **({"q": q} if q else {})}
        return Call("GET", "/documents", kw={"params": params})

    @staticmethod
    def delete_document(document_id: int) -> Call:
        return Call("DELETE", f"/documents/{document_id}")

    @staticmethod
    def conversations(offset: int = 0, limit: int = 50) -> Call:
        return Call("GET", "/conversations", kw={"params": {"offset": offset, "limit": limit}})

    @staticmethod
    def conversation(conversation_id: str) -> Call:
        """Every turn: the question as asked and as routed, the answer, its route and citations."""
        return Call("GET", f"/conversations/{conversation_id}")

    @staticmethod
    def delete_conversation(conversation_id: str) -> Call:
        return Call("DELETE", f"/conversations/{conversation_id}", (204,), then=lambda r: None)


CALLS = [name for name, value in vars(OperatorCalls).items() if isinstance(value, staticmethod)]


def _sync(name: str) -> Callable[..., Any]:
    make = getattr(OperatorCalls, name)

    @functools.wraps(make)
    def call(self: Any, *args: Any, wait: bool = True, progress: Progress | None = None, **kwargs: Any) -> Any:
        c: Call = make(*args, **kwargs)
        answer = self.request(c.method, c.path, ok=c.ok, **c.kw)
        if c.job:
            return self.wait(answer, progress) if wait else answer
        return c.then(answer) if c.then is not None else answer

    return call


def _async(name: str) -> Callable[..., Any]:
    make = getattr(OperatorCalls, name)

    @functools.wraps(make)
    async def call(self: Any, *args: Any, wait: bool = True, progress: Progress | None = None, **kwargs: Any) -> Any:
        c: Call = make(*args, **kwargs)
        answer = await self.request(c.method, c.path, ok=c.ok, **c.kw)
        if c.job:
            return await self.wait(answer, progress) if wait else answer
        return c.then(answer) if c.then is not None else answer

    return call


class AdminCalls:
    """Mixed into `Client`, which supplies `request` and `wait`: every `OperatorCalls` call, sent."""

    def request(self, method: str, path: str, ok: tuple[int, ...] = (200,), **kw: Any) -> Any:
        raise NotImplementedError

    def wait(self, job: Job, progress: Progress | None = None) -> Job:
        raise NotImplementedError


class AsyncAdminCalls:
    """Mixed into `AsyncClient`: the same calls, awaited."""

    async def request(self, method: str, path: str, ok: tuple[int, ...] = (200,), **kw: Any) -> Any:
        raise NotImplementedError

    async def wait(self, job: Job, progress: Progress | None = None) -> Job:
        raise NotImplementedError


for _name in CALLS:
    setattr(AdminCalls, _name, _sync(_name))
    setattr(AsyncAdminCalls, _name, _async(_name))
