"""Issue 11 #12: a question whose SSE stream the client cuts is still logged (14 of 44 were, before)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.server import Server, free_port

pytestmark = pytest.mark.slow

TOKEN = "sse-token"


class _SlowChat(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat server that streams one token every 0.3 s for 30 s."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for i in range(100):
                chunk = {"choices": [{"delta": {"content": f"t{i} "}}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.3)
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args: object) -> None:
        pass


def test_cut_streams_are_logged(tmp_path: Path) -> None:
    chat = ThreadingHTTPServer(("127.0.0.1", free_port()), _SlowChat)
    threading.Thread(target=chat.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{chat.server_address[1]}/v1"
    server = Server(tmp_path / "data", TOKEN, tmp_path / "server.log", MOERAG_OPENAI_BASE_URL=base)
    try:
        client = server.start()
        client.post("/documents", json={"text": "Git records snapshots as commits. A branch is a pointer."})
        expert = client.post("/admin/api/experts", json={"name": "git", "generator": "openai:slow"}).json()
        client.put("/admin/api/clusters/0", json={"expert_id": expert["id"]})
        body = {"question": "What is a branch?", "mode": "expert", "expert": expert["id"], "stream": True}
        for _ in range(3):
            with httpx.Client(base_url=server.url, timeout=30) as c, c.stream("POST", "/ask", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("event: token"):
                        break  # cut the stream after the first token
        deadline = time.monotonic() + 60
        while len(logged := client.get("/admin/api/questions").json()["items"]) < 3:
            assert time.monotonic() < deadline, logged
            time.sleep(0.5)
        assert all("aborted" in q["timings"] for q in logged)
    finally:
        server.stop()
        chat.shutdown()
