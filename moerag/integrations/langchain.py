"""A LangChain retriever over a moerag server: moerag's routed retrieval (the gate, the expert's
lists or the whole store) as `Document`s, with the route and score in their metadata.

    from moerag.integrations.langchain import MoeragRetriever

    retriever = MoeragRetriever(url="http://127.0.0.1:8000", token="READ_TOKEN", k=5)
    docs = retriever.invoke("How do I undo a commit?")

Needs `langchain-core` (pip install langchain-core); moerag does not depend on it.
"""

from __future__ import annotations

from typing import Any

from moerag.client import AsyncClient, Client
from moerag.integrations import metadata
from moerag.types import Answer

try:
    from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
except ImportError as exc:  # a clear error, not a traceback deep in an import
    raise ImportError("moerag.integrations.langchain needs langchain-core: pip install langchain-core") from exc


def documents(answer: Answer) -> list[Document]:
    """An /ask answer's citations as LangChain documents, best first; the route rides in each one's
    metadata (path, expert, confidence, reason) beside the chunk's ids, source, title and score."""
    return [
        Document(page_content=c["text"], metadata=metadata(answer, c) | {"score": c["score"]})
        for c in answer.get("citations", [])
    ]


class MoeragRetriever(BaseRetriever):
    """moerag's retrieval as a LangChain retriever: `mode` "auto" lets the gate route (an expert's
    lists when confident, else the whole store), "fallback" searches everything, "expert" asks
    `expert` (an id); no answer is generated."""

    url: str
    token: str | None = None
    k: int = 5
    mode: str = "auto"
    expert: int | None = None
    timeout: float = 120.0

    def _body(self) -> dict[str, Any]:
        return {"k": self.k, "mode": self.mode, "expert": self.expert, "generate": False}

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        with Client(self.url, self.token, timeout=self.timeout) as kb:
            return documents(kb.ask(query, **self._body()))

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        async with AsyncClient(self.url, self.token, timeout=self.timeout) as kb:
            return documents(await kb.ask(query, **self._body()))
