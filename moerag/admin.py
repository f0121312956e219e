"""The operator's calls of moerag's API (experts, clusters, router, sources, conversations),
typed, for `moerag.client.Client`: each is one request, and the ones that start a job wait for
it unless `wait=False`."""

from __future__ import annotations

from typing import Any

from moerag.types import Job, Json, Progress

PAGE = 500  # items a listing asks for at once


class AdminCalls:
    """Mixed into `Client`, which supplies `request` and `wait`."""

    def request(self, method: str, path: str, ok: tuple[int, ...] = (200,), **kw: Any) -> Any:
        raise NotImplementedError

    def wait(self, job: Job, progress: Progress | None = None) -> Job:
        raise NotImplementedError

    # ---- experts and their lists -------------------------------------------------------------------

    def experts(self) -> list[Json]:
        return self.request("GET", "/admin/api/experts", params={"limit": 500})["items"]

    def create_expert(self, name: str, **fields: Any) -> Json:
        """A new expert (fields: description, system_prompt, generator, top_k, threshold)."""
        return self.request("POST", "/admin/api/experts", ok=(201,), json={"name": name, **fields})

    def define_expert(
        self,
        expert_id: int,
        ids: list[int] | None = None,
        source_prefix: str | None = None,
        tag: str | None = None,
        wait: bool = True,
        progress: Progress | None = None,
    ) -> Job:
        """Define an expert by documents (ids, a source folder, a tag): a job gives it lists of
        exactly their chunks and retrains the router."""
        body = {k: v for k, v in (("ids", ids), ("source_prefix", source_prefix), ("tag", tag)) if v}
        job = self.request("PUT", f"/admin/api/experts/{expert_id}/documents", ok=(202,), json=body)
        return self.wait(job, progress) if wait else job

    def clusters(self, expert_id: int | None = None) -> list[Json]:
        """The IVF lists (size, keywords, expert), all or one expert's."""
        items: list[Json] = self.request("GET", "/admin/api/clusters", params={"limit": PAGE})["items"]
        return items if expert_id is None else [c for c in items if c["expert_id"] == expert_id]

    def map_clusters(self, cluster_ids: list[int], expert_id: int | None) -> Json:
        """Give lists to an expert (None: unmap them); the shards and router follow."""
        body = {"cluster_ids": cluster_ids, "expert_id": expert_id}
        return self.request("POST", "/admin/api/clusters/assign", json=body)

    def propose_experts(self, n: int = 6, apply: bool = False, keep_mapped: bool = True, **fields: Any) -> Json:
        """Group the lists into `n` experts by centroid: the proposal and its diff (`apply`: made so)."""
        body = {"n": n, "apply": apply, "keep_mapped": keep_mapped, **fields}
        return self.request("POST", "/admin/api/experts/propose", json=body)

    def refit(
        self,
        experts: int | None = None,
        apply: bool = False,
        delete_emptied: bool = True,
        wait: bool = True,
        progress: Progress | None = None,
    ) -> Job:
        """Re-fit the experts to the content (recluster, propose, accept, retrain); without `apply`
        the job's result is the plan only."""
        body = {"experts": experts, "apply": apply, "delete_emptied": delete_emptied}
        job = self.request("POST", "/admin/api/experts/refit", ok=(202,), json=body)
        return self.wait(job, progress) if wait else job

    def delete_expert(self, expert_id: int) -> None:
        self.request("DELETE", f"/admin/api/experts/{expert_id}", ok=(200, 204))

    # ---- router, questions ----------------------------------------------------------------------------

    def train_router(self, activate: bool = True, wait: bool = True, progress: Progress | None = None) -> Job:
        job = self.request("POST", "/admin/api/router/train", ok=(202,), json={"activate": activate})
        return self.wait(job, progress) if wait else job

    def router_versions(self) -> list[Json]:
        return self.request("GET", "/admin/api/router/versions", params={"limit": 500})["items"]

    def activate_router(self, version_id: int) -> Json:
        return self.request("POST", f"/admin/api/router/versions/{version_id}/activate")

    def recluster(self, clusters: int | None = None, wait: bool = True, progress: Progress | None = None) -> Job:
        job = self.request("POST", "/admin/api/recluster", ok=(202,), json={"clusters": clusters})
        return self.wait(job, progress) if wait else job

    # ---- sources ---------------------------------------------------------------------------------------

    def sync(
        self,
        folder: str | None = None,
        git: str | None = None,
        branch: str | None = None,
        site: str | None = None,
        max_pages: int = 200,
        max_depth: int = 5,
        wait: bool = True,
        progress: Progress | None = None,
    ) -> Job:
        """Mirror one source on the server: a folder under MOERAG_SYNC_ROOTS, or a git repository
        (`branch`) or a web site (a start page or its sitemap; `max_pages`, `max_depth`) under
        MOERAG_SYNC_URLS; the job's result: the counts."""
        body: Json = {"folder": folder} if folder else {"git": git, "branch": branch} if git else {}
        if site:
            body = {"site": site, "max_pages": max_pages, "max_depth": max_depth}
        job = self.request("POST", "/admin/api/sync", ok=(202,), json=body)
        return self.wait(job, progress) if wait else job

    def questions(self, offset: int = 0, limit: int = 50) -> Json:
        """A page of the questions asked, newest first, each with its route."""
        return self.request("GET", "/admin/api/questions", params={"offset": offset, "limit": limit})

    def label_question(self, query_id: int, expert_id: int | None) -> Json:
        """The right expert for a question asked (None: none of them); the next training uses it."""
        return self.request("POST", f"/admin/api/questions/{query_id}/label", json={"expert_id": expert_id})

    # ---- conversations -------------------------------------------------------------------------------

    def conversations(self, offset: int = 0, limit: int = 50) -> Json:
        return self.request("GET", "/conversations", params={"offset": offset, "limit": limit})

    def conversation(self, conversation_id: str) -> Json:
        """Every turn: the question as asked and as routed, the answer, its route and citations."""
        return self.request("GET", f"/conversations/{conversation_id}")

    def delete_conversation(self, conversation_id: str) -> None:
        self.request("DELETE", f"/conversations/{conversation_id}", ok=(204,))
