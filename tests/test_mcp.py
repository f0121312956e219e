"""The MCP server, driven by the official `mcp` SDK's client: over streamable HTTP at /mcp on a
live server (a copy of the sample store, a read token set) and over stdio (`moerag mcp`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import READ_TOKEN, SampleStore, copy_sample
from tests.server import Server

QUESTION = "How do I generate a secure random token?"
TOOLS = {"ask", "search", "list_experts", "get_chunk"}


@pytest.fixture(scope="module")
def live(sample_server: Server) -> Server:
    return sample_server


def _http(live: Server, token: str = READ_TOKEN) -> Client:
    headers = {"Authorization": f"Bearer {token}"}
    return Client(
        streamable_http_client(f"{live.url}/mcp", http_client=httpx2.AsyncClient(headers=headers, timeout=120))
    )


async def _call(client: Client, tool: str, **arguments: Any) -> Any:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    return result.structured_content


async def _tour(client: Client) -> dict[str, Any]:
    """Every tool and resource once; what they returned."""
    async with client:
        seen: dict[str, Any] = {"tools": {t.name for t in (await client.list_tools()).tools}}
        seen["experts"] = (await _call(client, "list_experts"))["result"]
        seen["ask"] = await _call(client, "ask", question=QUESTION)
        expert = seen["experts"][-1]["name"]
        seen["forced"] = await _call(client, "ask", question=QUESTION, expert=expert)
        seen["search"] = await _call(client, "search", query=QUESTION, k=3)
        seen["scoped"] = await _call(client, "search", query=QUESTION, k=3, expert=expert)
        seen["chunk"] = await _call(client, "get_chunk", chunk_id=seen["search"]["hits"][0]["chunk_id"])
        missing = await client.call_tool("ask", {"question": QUESTION, "expert": "no such expert"})
        seen["missing"] = (missing.is_error, missing.content[0].text)  # type: ignore[union-attr]
        listing = await client.read_resource("moerag://documents")
        seen["documents"] = json.loads(listing.contents[0].text)  # type: ignore[union-attr]
        first = seen["documents"][0]["id"]
        seen["document"] = (await client.read_resource(f"moerag://documents/{first}")).contents[0].text  # type: ignore[union-attr]
        return seen


def _check(seen: dict[str, Any], asked: dict[str, Any]) -> None:
    assert seen["tools"] >= TOOLS
    assert seen["ask"]["route"]["path"] == asked["route"]["path"]
    assert [c["chunk_id"] for c in seen["ask"]["citations"]] == [c["chunk_id"] for c in asked["citations"]]
    assert seen["ask"]["answer"] and "[1]" in seen["ask"]["answer"]
    expert = seen["experts"][-1]
    assert seen["forced"]["route"]["path"] == "expert" and seen["forced"]["route"]["expert"]["id"] == expert["id"]
    assert len(seen["search"]["hits"]) == 3 and seen["search"]["clusters_scanned"] > len(expert["clusters"])
    assert seen["scoped"]["clusters_scanned"] == len(expert["clusters"])
    assert seen["chunk"]["id"] == seen["search"]["hits"][0]["chunk_id"] and seen["chunk"]["text"]
    assert seen["missing"][0] and "no expert named" in seen["missing"][1]
    assert seen["documents"] and {"id", "title", "source", "chunks"} <= set(seen["documents"][0])
    assert len(seen["document"]) > 100


def test_agents_ask_and_search_over_streamable_http(live: Server) -> None:
    asked = httpx.post(
        f"{live.url}/ask", json={"query": QUESTION}, headers={"Authorization": f"Bearer {READ_TOKEN}"}, timeout=120
    ).json()
    _check(anyio.run(_tour, _http(live)), asked)


def test_the_http_transport_needs_the_read_token(live: Server) -> None:
    r = httpx.post(f"{live.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"

    async def denied() -> None:
        async with _http(live, token="not-the-token"):
            pass

    with pytest.raises(Exception):  # noqa: B017 - the SDK wraps the 401 in its own errors
        anyio.run(denied)


def test_agents_ask_and_search_over_stdio(tmp_path: Path, sample_store: SampleStore) -> None:
    data = copy_sample(sample_store, tmp_path / "data")
    env = {k: os.environ[k] for k in ("MOERAG_CACHE_DIR", "HF_HUB_OFFLINE", "HOME") if k in os.environ}
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "app.cli", "mcp"],
        env={**env, "MOERAG_DATA_DIR": str(data)},
        cwd=os.getcwd(),
    )
    seen = anyio.run(_tour, Client(params))
    assert seen["tools"] >= TOOLS and seen["ask"]["route"]["path"] in ("expert", "fallback")
    assert seen["forced"]["route"]["path"] == "expert"
