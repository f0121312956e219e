"""moerag inside agent frameworks: a retriever for LangChain (`moerag.integrations.langchain`) and
one for LlamaIndex (`moerag.integrations.llamaindex`), each over `moerag.client`; each imports
its framework when used, so neither is a dependency of moerag."""

from __future__ import annotations

from typing import Any

from moerag.types import Answer, Citation


def metadata(answer: Answer, citation: Citation) -> dict[str, Any]:
    """What a retrieved passage carries beside its text in either framework: its chunk and
    document ids, source, title and heading, the route of the question (path, expert, confidence,
    reason) and the question's id in moerag's log."""
    route: Any = answer.get("route") or {}
    return {
        "chunk_id": citation["chunk_id"],
        "document_id": citation["document_id"],
        "source": citation["source"],
        "title": citation["title"],
        "heading": citation.get("heading"),
        "route": {key: route.get(key) for key in ("path", "expert", "confidence", "reason")},
        "query_id": answer.get("query_id"),
    }
