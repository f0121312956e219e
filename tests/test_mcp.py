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
        listed = (await client.list_tools()).tools
        seen: dict[str, Any] = {"tools": {t.name for t in listed}, "listed": listed}
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
    for tool in seen["listed"]:  # each says it only reads, and says what each parameter is
        assert tool.annotations is not None and tool.annotations.read_only_hint is True, tool.name
        assert tool.annotations.destructive_hint is False, tool.name
        for name, schema in tool.input_schema.get("properties", {}).items():
            assert schema.get("description"), (tool.name, name)
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


def test_mcp_ask_shares_the_rate_limit_of_ask(client: Any) -> None:
    """Issue 52 #6: MCP's `ask` ignored the per-client rate limit (30 of 30 answered while `/ask`
    gave 26 × 429). It now takes from the same bucket: once spent, the tool says `rate_limited`
    and `/ask` answers 429."""
    from app.services.ratelimit import RateLimiter
    from tests.conftest import AUTH

    # 20 a minute, a burst of 4, on the one gate every door of the app passes
    client.app.state.answer_gate.limiter = RateLimiter(client.app.state.runtime.engine, 20)
    note = {"text": "# Git\n\nBranches and merges are cheap. " * 20}
    assert client.post("/documents", json=note, headers=AUTH).status_code == 201
    headers = {"Accept": "application/json, text/event-stream"}
    answers = []
    for i in range(6):
        call = {"name": "ask", "arguments": {"question": "what is a git branch?"}}
        r = client.post(
            "/mcp", json={"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": call}, headers=headers
        )
        data = json.loads(next(line[5:] for line in r.text.splitlines() if line.startswith("data:")))
        answers.append(data["result"])
    limited = [a for a in answers if a.get("isError") and "rate_limited" in a["content"][0]["text"]]
    assert len(limited) == 2 and not any(a.get("isError") for a in answers[:4]), answers
    assert client.post("/ask", json={"query": "what is a git branch?"}).status_code == 429


def test_silent_and_half_sent_connections_are_closed_and_get_mcp_is_refused(live: Server) -> None:
    """Issue 52 #7: idle and half-sent sockets and `GET /mcp` streams were never closed. A socket
    that sends nothing, or stops mid-headers, is closed MOERAG_HEADER_SECONDS (2 here) after it
    opened; a request on time is answered; GET /mcp is a 405."""
    import socket
    import time

    host, port = live.url.removeprefix("http://").split(":")

    def closed_after(first: bytes) -> float:
        with socket.create_connection((host, int(port)), timeout=30) as s:
            t = time.monotonic()
            s.sendall(first)
            while s.recv(4096):  # the server's close reads as b""
                pass
            return time.monotonic() - t

    assert 1.5 < closed_after(b"") < 10
    assert 1.5 < closed_after(b"GET /healthz HTTP/1.1\r\nHost: x\r\n") < 10  # headers never finished
    r = httpx.get(f"{live.url}/mcp", headers={"Authorization": f"Bearer {READ_TOKEN}"}, timeout=10)
    assert r.status_code == 405 and r.headers["allow"] == "POST", r.text
    assert httpx.get(f"{live.url}/healthz", timeout=10).status_code == 200


def test_mcp_ids_beyond_int64_are_refused_at_once(client: Any) -> None:
    """Issue 52 #7: a chunk id beyond int64 reached SQL (an unhandled exception, ~2 s of CPU and
    ~240 log lines a call); it is now refused by the tool's schema, and a document resource's
    id likewise."""
    import time

    headers = {"Accept": "application/json, text/event-stream"}

    def rpc(method: str, params: dict[str, Any]) -> Any:
        r = client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, headers=headers)
        return json.loads(next(line[5:] for line in r.text.splitlines() if line.startswith("data:")))

    t = time.monotonic()
    chunk = rpc("tools/call", {"name": "get_chunk", "arguments": {"chunk_id": 2**70}})["result"]
    assert chunk["isError"] and "less than or equal" in chunk["content"][0]["text"], chunk
    document = rpc("resources/read", {"uri": f"moerag://documents/{2**70}"})
    assert "error" in document and "no document" in document["error"]["message"], document
    assert time.monotonic() - t < 2.0
