"""Issue 40: experts that follow a team's own corpus, with a real server.

The pydoc sample store plus eight documents on two topics it never saw (sourdough baking,
Kubernetes networking, tests/data/own_topics): before the re-fit no question on them is a
confident route to an old expert and staleness reports the drift; after the one re-fit action
they route to new experts named from their titles, and no expert is left empty. A fresh store
of those eight documents alone, re-fitted with two experts, routes each question to its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import TOKEN, SampleStore, copy_sample
from tests.server import Server

OWN = Path(__file__).parent / "data" / "own_topics"
QUESTIONS: dict[str, list[str]] = json.loads((OWN / "questions.json").read_text())
MARK = {"sourdough": "ourdough", "kubernetes": "Kubernetes"}  # in the new experts' names (from titles)


def wait(client: httpx.Client, job: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
    """A job's final state, polled until done (no fixed sleep: each poll is a request)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = client.get(f"/jobs/{job['id']}").json()
        if body["status"] in ("done", "failed"):
            assert body["status"] == "done", body
            return dict(body)
        time.sleep(0.2)
    raise TimeoutError(job)


def upload_own_topics(client: httpx.Client) -> None:
    files = [("files", (p.name, p.read_bytes(), "text/markdown")) for p in sorted(OWN.glob("*.md"))]
    job = client.post("/documents/bulk", files=files)
    assert job.status_code == 202, job.text
    assert wait(client, job.json())["result"]["created"] == 8


def routes(client: httpx.Client) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for topic, questions in QUESTIONS.items():
        for q in questions:
            r = client.post("/ask", json={"question": q})
            assert r.status_code == 200, r.text
            out.setdefault(topic, []).append(r.json()["route"])
    return out


def experts(client: httpx.Client) -> dict[str, list[int]]:
    return {e["name"]: e["clusters"] for e in client.get("/admin/api/experts", params={"limit": 500}).json()["items"]}


@pytest.fixture(scope="module")
def sample_server(
    tmp_path_factory: pytest.TempPathFactory, sample_store: SampleStore
) -> Iterator[tuple[Server, httpx.Client]]:
    tmp = tmp_path_factory.mktemp("own-corpus")
    server = Server(copy_sample(sample_store, tmp / "data"), TOKEN, tmp / "server.log")
    try:
        yield server, server.start(400, "--sample")
    finally:
        server.stop()


def test_new_topics_fit_no_expert_until_one_refit_gives_them_experts(
    sample_server: tuple[Server, httpx.Client],
) -> None:
    server, client = sample_server
    before = experts(client)
    upload_own_topics(client)

    # Before: no question on the new topics is a confident route to an existing expert.
    for topic, found in routes(client).items():
        for route in found:
            assert route["path"] == "fallback", (topic, route)
    # ... and staleness reports the drift: in the admin API, /readyz and /metrics.
    # Every new document is in the drift; a sample document may be too: the sample store's clusters
    # follow its bfloat16 embeddings, which move with how ingestion batched them (seen: "operator",
    # 9 of its 17 chunks below their lists' floors, in one build of two).
    stale = client.get("/admin/api/router/staleness").json()
    drifted = stale["drift"]["documents"]
    assert stale["outgrown"] is True and 8 <= drifted <= 9, stale
    assert stale["reason"].startswith("content outgrew the experts: ") and f"{drifted} documents" in stale["reason"]
    assert {d["source"].split("/")[-1] for d in stale["drift"]["shown"]} >= {p.name for p in OWN.glob("*.md")}
    assert client.get("/readyz").json()["router"]["outgrown"] is True
    metrics = client.get("/metrics").text
    assert f"moerag_documents_fitting_no_expert {drifted}.0" in metrics

    # The plan changes nothing and shows the diff: today's experts kept, two new ones.
    plan = wait(client, client.post("/admin/api/experts/refit", json={}).json())["result"]
    assert plan["applied"] is False and experts(client) == before
    new = [e for e in plan["experts"] if e["new"]]
    assert sorted(MARK["kubernetes"] in e["name"] or MARK["sourdough"] in e["name"] for e in new) == [True, True]
    assert all(not e["new"] for e in plan["experts"] if e["name"] in before)

    # The CLI applies it through the server (--yes), after printing the same diff.
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "MOERAG_LOG_LEVEL": "WARNING", "MOERAG_ADMIN_TOKEN": TOKEN}
    cmd = [sys.executable, "-m", "app.cli", "experts", "refit", "--server", server.url, "--quiet"]
    shown = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert shown.returncode == 0 and "run again with --yes" in shown.stdout, shown.stderr
    assert experts(client) == before
    applied = subprocess.run([*cmd, "--yes"], capture_output=True, text=True, timeout=600, env=env)
    assert applied.returncode == 0, applied.stderr
    assert "applied:" in applied.stdout

    after = experts(client)
    assert all(clusters for clusters in after.values()), after  # no empty experts remain
    right = 0
    for topic, found in routes(client).items():
        right += sum(r["path"] == "expert" and MARK[topic] in r["expert"]["name"] for r in found)
    assert right >= 5, routes(client)
    assert client.get("/admin/api/router/staleness").json()["outgrown"] is False


def test_a_fresh_small_store_refitted_with_two_experts_routes_each_question_to_its_own(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", TOKEN, tmp_path / "server.log")
    try:
        client = server.start(180)
        upload_own_topics(client)
        job = client.post("/admin/api/experts/refit", json={"experts": 2, "apply": True}).json()
        result = wait(client, job)["result"]
        assert len(result["experts"]) == 2 and result["clusters"] >= 2, result
        names = experts(client)
        assert len(names) == 2 and all(names.values())
        for topic, found in routes(client).items():
            for route in found:
                assert route["path"] == "expert" and MARK[topic] in route["expert"]["name"], (topic, route)
        # A proposal that cannot make as many experts as asked says why.
        note = client.post("/admin/api/experts/propose", json={"n": 50, "keep_mapped": False}).json()["note"]
        assert note and "not 50" in note
    finally:
        server.stop()
