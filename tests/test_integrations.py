"""The LangChain and LlamaIndex retrievers return moerag's citations (as /ask gives them, best
first) with the route and scores in their metadata, sync and async, against a live server."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.conftest import READ_TOKEN
from tests.server import Server

QUESTION = "How do I generate a secure random token?"


@pytest.fixture(scope="module")
def live(sample_server: Server) -> Server:
    return sample_server


def _asked(live: Server, k: int) -> dict[str, Any]:
    body = {"query": QUESTION, "k": k, "generate": False}
    r = httpx.post(f"{live.url}/ask", json=body, headers={"Authorization": f"Bearer {READ_TOKEN}"}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_the_langchain_retriever_returns_moerag_s_citations(live: Server) -> None:
    pytest.importorskip("langchain_core")
    from moerag.integrations.langchain import MoeragRetriever

    asked = _asked(live, 4)
    retriever = MoeragRetriever(url=live.url, token=READ_TOKEN, k=4)
    docs = retriever.invoke(QUESTION)
    assert [d.metadata["chunk_id"] for d in docs] == [c["chunk_id"] for c in asked["citations"]]
    assert [d.page_content for d in docs] == [c["text"] for c in asked["citations"]]
    assert docs[0].metadata["score"] == pytest.approx(asked["citations"][0]["score"])
    assert docs[0].metadata["route"]["path"] == asked["route"]["path"]
    assert docs[0].metadata["route"]["expert"] == asked["route"]["expert"]
    again = asyncio.run(retriever.ainvoke(QUESTION))
    assert [d.metadata["chunk_id"] for d in again] == [d.metadata["chunk_id"] for d in docs]


def test_the_llamaindex_retriever_returns_moerag_s_citations(live: Server) -> None:
    pytest.importorskip("llama_index.core")
    from moerag.integrations.llamaindex import MoeragRetriever

    asked = _asked(live, 3)
    retriever = MoeragRetriever(live.url, READ_TOKEN, k=3)
    found = retriever.retrieve(QUESTION)
    assert [n.node.metadata["chunk_id"] for n in found] == [c["chunk_id"] for c in asked["citations"]]
    assert [n.score for n in found] == pytest.approx([c["score"] for c in asked["citations"]])
    assert found[0].node.metadata["route"]["path"] == asked["route"]["path"]
    again = asyncio.run(retriever.aretrieve(QUESTION))
    assert [n.node.node_id for n in again] == [n.node.node_id for n in found]


def test_the_client_package_needs_no_framework() -> None:
    import subprocess
    import sys

    frameworks = "('langchain_core', 'llama_index')"
    code = f"import sys, moerag.client; print(any(m.split('.')[0] in {frameworks} for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"  # the frameworks load only with their integration module
