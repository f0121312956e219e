"""A LlamaIndex retriever over a moerag server: moerag's routed retrieval as `NodeWithScore`s, with
the route and ids in each node's metadata.

    from moerag.integrations.llamaindex import MoeragRetriever

    retriever = MoeragRetriever(url="http://127.0.0.1:8000", token="READ_TOKEN", k=5)
    nodes = retriever.retrieve("How do I undo a commit?")

Needs `llama-index-core` (pip install llama-index-core); moerag does not depend on it.
"""

from __future__ import annotations

from typing import Any

from moerag.client import AsyncClient, Client
from moerag.integrations import metadata
from moerag.types import Answer

try:
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
except ImportError as exc:  # a clear error, not a traceback deep in an import
    raise ImportError("moerag.integrations.llamaindex needs llama-index-core: pip install llama-index-core") from exc


def nodes(answer: Answer) -> list[NodeWithScore]:
    """An /ask answer's citations as scored nodes, best first (the node id: moerag's chunk id)."""
    out = []
    for c in answer.get("citations", []):
        node = TextNode(id_=f"moerag-chunk-{c['chunk_id']}", text=c["text"], metadata=metadata(answer, c))
        out.append(NodeWithScore(node=node, score=c["score"]))
    return out


class MoeragRetriever(BaseRetriever):
    """moerag's retrieval as a LlamaIndex retriever (`mode`: "auto", "fallback" or "expert" with
    `expert`, an id); no answer is generated."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        k: int = 5,
        mode: str = "auto",
        expert: int | None = None,
        timeout: float = 120.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.url, self.token, self.timeout = url, token, timeout
        self.body = {"k": k, "mode": mode, "expert": expert, "generate": False}

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        with Client(self.url, self.token, timeout=self.timeout) as kb:
            return nodes(kb.ask(query_bundle.query_str, **self.body))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        async with AsyncClient(self.url, self.token, timeout=self.timeout) as kb:
            return nodes(await kb.ask(query_bundle.query_str, **self.body))
