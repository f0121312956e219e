"""Experts a team owns, with a real server on the pydoc sample store and documents on three topics
it never saw (tests/data/own_topics: sourdough baking, Kubernetes networking, beekeeping; four
documents each). Before a re-fit no question on them is a confident route to an old expert and
staleness reports the drift; one re-fit gives each topic an expert of its own, named from its
words. The operator then renames one, defines one by its documents and gives the third a prompt:
two more re-fits and a proposal with "keep" unticked leave all three as they are, every question
is answered by its own expert or the fallback (never confidently by another), and a deleted
expert comes back with one undo. A fresh store of these documents alone re-fits into as many
experts as asked, and one undo restores the store as it was (no experts, the lists of before).
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
# A word of each topic: one is in its new expert's name, and in each of its documents' file names.
WORDS = {
    "sourdough": ("sourdough", "starter", "levain", "dough", "bread", "loaf"),
    "kubernetes": ("kubernetes", "service", "pod", "network", "ingress", "dns", "cluster"),
    "beekeeping": ("bee", "hive", "honey", "varroa", "swarm", "colony", "mite"),
}
DOCUMENTS = len(list(OWN.glob("*.md")))


def topic_of(name: str) -> str | None:
    """The topic whose words an expert's name carries (None: none, or more than one)."""
    found = [t for t, words in WORDS.items() if any(w in name.lower() for w in words)]
    return found[0] if len(found) == 1 else None


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
    assert wait(client, job.json())["result"]["created"] == DOCUMENTS


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


def own_experts(client: httpx.Client) -> dict[str, dict[str, Any]]:
    """{topic: its expert} among today's experts, by the file names of the documents each holds."""
    out = {}
    for e in client.get("/admin/api/experts", params={"limit": 500}).json()["items"]:
        if e["clusters"]:
            sources = {
                hit["source"]
                for c in e["clusters"]
                for hit in client.get(f"/admin/api/clusters/{c}", params={"samples": 50}).json()["samples"]
            }
            topics = {t for t in WORDS if all(src.split("/")[-1].startswith(t) for src in sources)}
            if len(topics) == 1:
                out[topics.pop()] = e
    return out


def never_confidently_elsewhere(client: httpx.Client, mine: dict[str, int]) -> int:
    """Every question of a topic goes to its own expert (mine[topic]) or the fallback. -> how many to its own."""
    right = 0
    for topic, found in routes(client).items():
        for route in found:
            assert route["path"] == "fallback" or route["expert"]["id"] == mine[topic], (topic, route)
            right += route["path"] == "expert"
    return right


def refit(client: httpx.Client, **params: Any) -> dict[str, Any]:
    return wait(client, client.post("/admin/api/experts/refit", json=params).json())["result"]


def test_new_topics_get_one_expert_each_and_keep_them_through_refits_and_proposals(
    sample_server: tuple[Server, httpx.Client],
) -> None:
    server, client = sample_server
    before = experts(client)
    upload_own_topics(client)

    # Before: no question on the new topics is a confident route to an existing expert.
    for topic, found in routes(client).items():
        for route in found:
            assert route["path"] == "fallback", (topic, route)
    # ... and staleness reports the drift: in the admin API, /readyz and /metrics. Every new
    # document is in it; a sample document may be too (the sample store's clusters follow its
    # bfloat16 embeddings, which move with how ingestion batched them).
    stale = client.get("/admin/api/router/staleness").json()
    drifted = stale["drift"]["documents"]
    assert stale["outgrown"] is True and DOCUMENTS <= drifted <= DOCUMENTS + 1, stale
    assert stale["reason"].startswith("content outgrew the experts: ") and f"{drifted} documents" in stale["reason"]
    assert {d["source"].split("/")[-1] for d in stale["drift"]["shown"]} >= {p.name for p in OWN.glob("*.md")}
    assert client.get("/readyz").json()["router"]["outgrown"] is True
    assert f"moerag_documents_fitting_no_expert {drifted}.0" in client.get("/metrics").text

    # The plan changes nothing and shows the diff: today's experts kept, one new expert a topic,
    # each named (<= 40 characters) with a word of its topic and holding its four documents.
    plan = refit(client)
    assert plan["applied"] is False and experts(client) == before
    new = [e for e in plan["experts"] if e["new"]]
    assert sorted(topic_of(e["name"]) or "" for e in new) == sorted(WORDS), new
    assert all(len(e["name"]) <= 40 and e["documents"] == 4 for e in new), new
    assert all(not e["new"] for e in plan["experts"] if e["name"] in before)

    # The CLI applies it through the server (--yes), after printing the same diff.
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "MOERAG_LOG_LEVEL": "WARNING", "MOERAG_ADMIN_TOKEN": TOKEN}
    cmd = [sys.executable, "-m", "app.cli", "experts", "refit", "--server", server.url, "--quiet"]
    shown = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert shown.returncode == 0 and "run again with --yes" in shown.stdout, shown.stderr
    assert experts(client) == before
    applied = subprocess.run([*cmd, "--yes"], capture_output=True, text=True, timeout=600, env=env)
    assert applied.returncode == 0 and "applied:" in applied.stdout, applied.stderr
    assert all(clusters for clusters in experts(client).values())  # no empty experts remain
    mine = own_experts(client)
    assert set(mine) == set(WORDS), mine
    assert never_confidently_elsewhere(client, {t: e["id"] for t, e in mine.items()}) >= 6
    assert client.get("/admin/api/router/staleness").json()["outgrown"] is False

    # The operator makes them the team's: a new name, a definition by documents, a prompt.
    ids = {t: e["id"] for t, e in mine.items()}
    url = "/admin/api/experts/{}".format
    assert client.patch(url(ids["sourdough"]), json={"name": "Sourdough baking"}).status_code == 200
    kube_docs = [
        d["id"]
        for d in client.get("/documents", params={"limit": 500}).json()["items"]
        if d["source"].split("/")[-1].startswith("kubernetes")
    ]
    assert len(kube_docs) == 4
    defined = client.put(url(ids["kubernetes"]) + "/documents", json={"ids": kube_docs})
    assert defined.status_code == 202 and wait(client, defined.json())["result"]["documents"] == 4
    prompt = "Answer as a beekeeper, briefly."
    assert client.patch(url(ids["beekeeping"]), json={"system_prompt": prompt}).status_code == 200
    curated = {e["id"]: e for e in client.get("/admin/api/experts", params={"limit": 500}).json()["items"]}
    fields = ("name", "system_prompt", "documents", "owned", "slugs")

    def unchanged() -> None:
        now = {e["id"]: e for e in client.get("/admin/api/experts", params={"limit": 500}).json()["items"]}
        for e in ids.values():
            assert {f: now[e][f] for f in fields} == {f: curated[e][f] for f in fields}, now[e]
            assert now[e]["owned"] and now[e]["clusters"], now[e]
        assert own_experts(client).keys() == ids.keys()
        assert {t: e["id"] for t, e in own_experts(client).items()} == ids

    # Two more re-fits (nothing uploaded since; the second asks for more experts) and a proposal
    # with "keep" unticked: the team's experts keep their names, prompts, documents and lists.
    for params in ({"apply": True}, {"apply": True, "experts": 12}):
        applied_plan = refit(client, **params)
        kept = {e["expert_id"]: e for e in applied_plan["experts"]}
        assert all(kept[e]["owned"] and kept[e]["documents"] == 4 for e in ids.values()), applied_plan
        assert not {d["id"] for d in applied_plan.get("deleted_experts", [])} & set(ids.values())
        unchanged()
    proposal = client.post("/admin/api/experts/propose", json={"n": 6, "keep_mapped": False, "apply": True}).json()
    assert proposal["diff"]["emptied_experts"] == [] and proposal["diff"]["moved"] == [], proposal["diff"]
    unchanged()
    assert never_confidently_elsewhere(client, ids) >= 6

    # Deleting one says so and where its documents go; one undo brings it back as it was.
    gone = client.delete(url(ids["beekeeping"])).json()
    assert (
        gone["deleted"]["id"] == ids["beekeeping"] and gone["documents"] == 4 and "fallback" in gone["documents_go_to"]
    )
    for route in routes(client)["beekeeping"]:
        assert route["path"] == "fallback", route
    history = client.get("/admin/api/experts/history").json()["items"]
    assert history[0]["action"] == "delete" and curated[ids["beekeeping"]]["name"] in history[0]["experts"]
    undone = wait(client, client.post("/admin/api/experts/undo").json())["result"]
    assert undone["action"] == "delete" and undone["restored"] == [curated[ids["beekeeping"]]["name"]], undone
    unchanged()
    assert never_confidently_elsewhere(client, ids) >= 6


def test_a_fresh_store_refits_into_its_topics_and_one_undo_restores_it(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", TOKEN, tmp_path / "server.log")
    try:
        client = server.start(180)
        upload_own_topics(client)
        lists = len(client.get("/admin/api/clusters", params={"limit": 500}).json()["items"])
        result = refit(client, experts=3, apply=True)
        assert len(result["experts"]) == 3 and result["clusters"] >= 3, result
        assert sorted(topic_of(e["name"]) or "" for e in result["experts"]) == sorted(WORDS), result
        names = experts(client)
        assert len(names) == 3 and all(names.values())
        mine = {topic_of(e["name"]): e["expert_id"] for e in result["experts"]}
        for topic, found in routes(client).items():
            for route in found:
                assert route["path"] == "expert" and route["expert"]["id"] == mine[topic], (topic, route)
        # A proposal that cannot make as many experts as asked says why.
        note = client.post("/admin/api/experts/propose", json={"n": 50, "keep_mapped": False}).json()["note"]
        assert note and "nothing to group" in note
        # One undo: no experts again, the lists of before, and no confidence claimed by anyone.
        undone = wait(client, client.post("/admin/api/experts/undo").json())["result"]
        assert undone["action"] == "refit" and sorted(undone["removed"]) == sorted(names), undone
        assert experts(client) == {}
        assert len(client.get("/admin/api/clusters", params={"limit": 500}).json()["items"]) == lists
        route = client.post("/ask", json={"question": QUESTIONS["beekeeping"][0]}).json()["route"]
        assert (route["path"], route["reason"], route["confidence"]) == ("fallback", "one_expert", None), route
    finally:
        server.stop()
