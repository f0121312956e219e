"""Issue 40, item 4: an expert defined by documents (ids, a source folder, a tag) holds exactly
their chunks, keeps them through later uploads and a re-fit, and gets routed to."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.clustering.expert_documents import matches
from app.core.models import Chunk, Cluster, Document
from tests.conftest import AUTH
from tests.helpers import topic_doc, wait_job


def test_a_selector_matches_ids_a_folder_or_a_tag() -> None:
    sel = {"ids": [3], "source_prefix": "team/k8s/", "tag": "k8s"}
    assert matches(sel, 3, "x.md", {})
    assert matches(sel, None, "team/k8s/dns.md", None)
    assert matches(sel, 9, "a.md", {"tags": ["net", "k8s"]}) and matches(sel, 9, "a.md", {"tags": "k8s"})
    assert not matches(sel, 9, "team/k8s-old/a.md", {"tags": ["k8"]})
    assert not matches({"tag": "k8s"}, 9, "a.md", {"tag": "k8s"})  # the key is `tags`


def _holdings(rt: Any) -> dict[int | None, set[str]]:
    """{expert: the sources of the documents whose chunks sit in its lists}."""
    with rt.sessions() as s:
        rows = s.execute(
            select(Cluster.expert_id, Document.source)
            .select_from(Chunk)
            .join(Document)
            .join(Cluster, Cluster.id == Chunk.cluster_id)
        )
        out: dict[int | None, set[str]] = {}
        for e, source in rows:
            out.setdefault(e, set()).add(source)
    return out


def test_an_expert_defined_by_a_folder_holds_exactly_its_documents(client: TestClient, routed: dict[str, Any]) -> None:
    experts = routed["experts"]
    rt = client.app.state.runtime  # type: ignore[attr-defined]
    r = client.post("/admin/api/experts", json={"name": "python notes"}, headers=AUTH)
    python = r.json()["id"]
    url = f"/admin/api/experts/{python}/documents"
    assert client.put(url, json={}, headers=AUTH).status_code == 422
    assert client.put(url, json={"tag": "nobody-has-it"}, headers=AUTH).status_code == 409
    assert client.put("/admin/api/experts/999/documents", json={"tag": "x"}, headers=AUTH).status_code == 404
    job = client.put(url, json={"source_prefix": "python-"}, headers=AUTH)
    assert job.status_code == 202, job.text
    done = wait_job(client, job.json()["id"])
    assert done["status"] == "done", done
    assert done["result"]["documents"] == 8 and done["result"]["lists"] >= 1
    held = _holdings(rt)
    assert held[python] == {f"python-{i}.md" for i in range(8)}
    for topic, e in experts.items():  # the other experts keep their own documents
        assert held[e] and all(src.startswith(topic) for src in held[e]), (topic, held[e])
    listed = client.get("/admin/api/experts", headers=AUTH).json()["items"]
    assert next(x for x in listed if x["id"] == python)["documents"] == {"source_prefix": "python-"}

    # Later documents: a matching one goes to the expert's lists, a python-like one outside the
    # folder does not, and a tagged git note follows the vote as before.
    for source, body in (
        ("python-9.md", topic_doc("python", 9)),
        ("elsewhere/py.md", topic_doc("python", 10)),
        ("git-9.md", topic_doc("git", 9)),
    ):
        assert client.post("/documents", json={"text": body, "source": source}, headers=AUTH).status_code == 201
    held = _holdings(rt)
    assert "python-9.md" in held[python] and "elsewhere/py.md" not in held[python]
    assert "git-9.md" in held[experts["git"]]

    answer = client.post("/ask", json={"question": "Are Python tuples mutable sequences like lists?"}).json()
    assert answer["route"]["expert"]["id"] == python, answer["route"]

    # A re-fit regroups the rest and leaves the defined expert its documents.
    refit = client.post("/admin/api/experts/refit", json={"apply": True}, headers=AUTH).json()
    done = wait_job(client, refit["id"], timeout=300)
    assert done["status"] == "done", done
    assert done["result"]["defined_by_documents"] == [python]
    assert _holdings(rt)[python] == {f"python-{i}.md" for i in range(8)} | {"python-9.md"}

    assert client.delete(url, headers=AUTH).status_code == 204
    assert (
        next(x for x in client.get("/admin/api/experts", headers=AUTH).json()["items"] if x["id"] == python)[
            "documents"
        ]
        is None
    )


@pytest.mark.slow  # each command starts a runtime of its own (a model load)
def test_the_cli_defines_and_clears_an_expert_by_documents(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli.main import main
    from app.core.db import make_engine, make_sessionmaker
    from app.services.experts import create_expert

    docs = tmp_path / "docs"
    for t in ("git", "sqlite", "python"):
        (docs / t).mkdir(parents=True)
        for i in range(4):
            (docs / t / f"{t}-{i}.md").write_text(topic_doc(t, i, 4))
    data = str(tmp_path / "data")
    main(["--data-dir", data, "ingest", "--quiet", str(docs)])  # one list: never clustered
    engine = make_engine(f"sqlite:///{data}/moerag.db")
    with make_sessionmaker(engine).begin() as s:
        create_expert(s, {"name": "py"})
        create_expert(s, {"name": "rest"})
    engine.dispose()
    capsys.readouterr()
    with pytest.raises(SystemExit, match="give --ids, --source-prefix or --tag"):
        main(["--data-dir", data, "experts", "define", "py"])
    folder = "docs/python/"  # a folder's file is sourced as folder-name/path, whichever way it was ingested
    main(["--data-dir", data, "experts", "define", "py", "--source-prefix", folder, "--json"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["documents"] == 4 and result["lists"] >= 1, result
    main(["--data-dir", data, "experts", "define", "py", "--clear"])
    assert "defined by its clusters again" in capsys.readouterr().out


def test_a_store_of_one_list_is_carved_into_the_experts_lists_and_the_rest(runtime: Any) -> None:
    from app.clustering import expert_documents
    from app.services import expert_scopes
    from app.services.documents import Upload
    from app.services.experts import create_expert

    for t in ("git", "sqlite"):
        for i in range(4):
            runtime.ingestor.ingest(Upload(data=topic_doc(t, i, 4).encode(), source=f"{t}-{i}.md"))
    assert runtime.indexes.index.nlist == 1  # never clustered
    with runtime.sessions.begin() as s:
        expert = create_expert(s, {"name": "git"}).id
    assert expert_documents.define(runtime.sessions, expert, {"source_prefix": "git-"}) == 4
    result = expert_scopes.carve(runtime.indexes, expert)
    assert result["documents"] == 4 and runtime.indexes.index.nlist == result["lists"] + 1
    held = _holdings(runtime)
    assert held[expert] == {f"git-{i}.md" for i in range(4)}
    assert held[None] == {f"sqlite-{i}.md" for i in range(4)}
