"""The Python client (moerag.client) against a live server on a copy of the sample store: the
README's example as written, the async client, and errors as ApiError, JobFailed, Unreachable."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from moerag.client import ApiError, AsyncClient, Client, Unreachable
from tests.conftest import READ_TOKEN, TOKEN
from tests.server import Server, free_port

README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.fixture(scope="module")
def live(sample_server: Server) -> Server:
    return sample_server


def test_the_readme_example_runs_as_written(
    live: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = README.read_text()
    example = re.search(r"```python\n(from moerag\.client import Client\n.*?)```", text, re.S)
    assert example is not None, "README has the client example"
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "tokens.md").write_text(
        "# Tokens\n\nA token of 32 random bytes is long enough for most uses. " * 3
    )
    (tmp_path / "docs" / "notes.txt").write_text("Secrets come from the operating system's random source.")
    monkeypatch.chdir(tmp_path)
    code = example.group(1).replace("http://127.0.0.1:8000", live.url).replace("ADMIN_TOKEN", TOKEN)
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "2/2" in out and "2 documents added" in out and "[route]" in out and "[done]" in out
    with Client(live.url, TOKEN) as kb:
        turns = kb.request("GET", "/conversations/demo")["turns"]
        assert turns[1]["standalone"].endswith("and how long should it be?") and turns[1]["answer"]
        assert {d["source"] for d in kb.documents(q="tokens")["items"]} >= {"docs/tokens.md"}


def test_errors_are_typed(live: Server) -> None:
    with Client(live.url, READ_TOKEN) as kb:
        with pytest.raises(ApiError) as refused:
            kb.ask("How do I generate a secure random token?", mode="expert", expert=999_999)
        assert refused.value.status == 404 and refused.value.code == "expert_not_found"
        with pytest.raises(ApiError) as forbidden:
            kb.train_router()  # the read token cannot write
        assert forbidden.value.status == 401
    with Client(live.url, TOKEN) as admin:
        with pytest.raises(ApiError) as unset:
            admin.sync(site="https://docs.example.org/guide/")  # the sample server fetches no URL
        assert unset.value.status == 409 and unset.value.code == "not_configured"
        with pytest.raises(ApiError) as missing:
            admin.define_expert(999_999, source_prefix="docs/")
        assert missing.value.status == 404
    with Client(f"http://127.0.0.1:{free_port()}") as nobody, pytest.raises(Unreachable):
        nobody.ask("anyone?")


def test_the_async_client_asks_streams_and_searches(live: Server) -> None:
    async def tour() -> tuple[dict[str, object], list[str], int]:
        async with AsyncClient(live.url, READ_TOKEN) as kb:
            answer = await kb.ask("How do I generate a secure random token?")
            names = [name async for name, _ in kb.ask_stream("How do I generate a secure random token?")]
            hits = await kb.search("secure random token", k=3)
            return dict(answer), names, len(hits["hits"])

    answer, names, hits = asyncio.run(tour())
    assert answer["answer"] and names[0] == "route" and names[-1] == "done" and "token" in names and hits == 3


def test_the_operator_calls_read_and_refuse_as_the_api_does(live: Server) -> None:
    with Client(live.url, TOKEN) as admin:
        lists, experts = admin.clusters(), admin.experts()
        assert lists and {c["expert_id"] for c in lists} <= {e["id"] for e in experts} | {None}
        first = experts[0]["id"]
        assert {c["id"] for c in admin.clusters(first)} == {c["id"] for c in lists if c["expert_id"] == first}
        plan = admin.propose_experts(n=2, keep_mapped=False)  # without apply: the proposal, nothing changed
        assert len(plan["proposals"]) == 2 and not plan["applied"] and admin.experts() == experts
        with pytest.raises(ApiError) as missing:
            admin.map_clusters([999_999], first)
        assert missing.value.status == 404
        asked = admin.ask("How do I generate a secure random token?", conversation_id="operator-calls")
        assert admin.conversation("operator-calls")["turns"][0]["question"].startswith("How do I generate")
        assert "operator-calls" in {c["id"] for c in admin.conversations(limit=100)["items"]}
        admin.delete_conversation("operator-calls")
        with pytest.raises(ApiError) as gone:
            admin.conversation("operator-calls")
        assert gone.value.status == 404
        page = admin.questions(limit=5)
        assert page["items"] and asked["query_id"] in {q["id"] for q in admin.questions(limit=50)["items"]}


def test_a_folder_upload_reads_office_files_reports_what_it_skips_and_stores_relative_sources(
    live: Server, tmp_path: Path
) -> None:
    from tests.test_office import make_docx

    team = tmp_path / "team-handbook"
    (team / "ops").mkdir(parents=True)
    (team / "ops" / "backups.docx").write_bytes(make_docx())
    (team / "notes.md").write_text("# Pager\n\nThe pager rotation changes every Tuesday at noon.\n")
    (team / "diagram.vsdx").write_bytes(b"PK\x03\x04 not a format moerag reads")
    (team / "logo.png").write_bytes(b"\x89PNG")
    with Client(live.url, TOKEN) as kb:
        totals = kb.upload_folder(team)
        assert totals["created"] == 2 and totals["failed"] == 0, totals
        assert totals["skipped"] == 2
        assert {s["path"] for s in totals["skipped_files"]} == {"diagram.vsdx", "logo.png"}
        assert all("unsupported type" in s["reason"] for s in totals["skipped_files"])
        sources = {d["source"] for d in kb.documents(q="team-handbook", limit=50)["items"]}
        assert sources == {"team-handbook/ops/backups.docx", "team-handbook/notes.md"}  # never the uploader's path


def test_the_client_walks_a_folder_as_the_server_does(tmp_path: Path) -> None:
    from engine.parsing import folder_source, unsupported_reason, walk_documents
    from moerag.client import folder_source as client_source
    from moerag.client import walk_folder

    (tmp_path / "a" / ".git").mkdir(parents=True)
    (tmp_path / "a" / "x.md").write_text("x")
    (tmp_path / "a" / "y.xlsx").write_bytes(b"PK")
    (tmp_path / "a" / "z.exe").write_bytes(b"MZ")
    (tmp_path / "a" / ".git" / "config").write_text("[core]")
    files, links, unsupported = walk_documents(tmp_path / "a")
    client_files, skipped = walk_folder(tmp_path / "a")
    assert client_files == files and not links
    assert [s["path"] for s in skipped] == [p.name for p in unsupported] == ["z.exe"]
    assert "unsupported type (.exe)" in unsupported_reason(unsupported[0])
    assert [client_source(f, tmp_path / "a") for f in files] == [folder_source(f, tmp_path / "a") for f in files]
    # A folder reached through a link of its own is walked; a link inside it is named, never followed.
    (tmp_path / "via").symlink_to(tmp_path / "a")
    (tmp_path / "a" / "out.md").symlink_to(tmp_path / "a" / "x.md")
    via_files, via_skipped = walk_folder(tmp_path / "via")
    assert [f.name for f in via_files] == ["x.md", "y.xlsx"]
    assert {s["path"]: s["reason"] for s in via_skipped}["out.md"] == "a symbolic link (never followed)"


def test_the_async_client_has_every_call_the_client_has() -> None:
    import inspect

    def calls(cls: type) -> set[str]:
        return {n for n, _ in inspect.getmembers(cls, callable) if not n.startswith("_")}

    assert calls(Client) == calls(AsyncClient), calls(Client) ^ calls(AsyncClient)
    for name in calls(Client) - {"request"}:
        assert inspect.iscoroutinefunction(getattr(AsyncClient, name)) or inspect.isasyncgenfunction(
            getattr(AsyncClient, name)
        ), name
    assert {"refit", "propose_experts", "train_router", "documents", "conversation"} <= calls(AsyncClient)


def test_the_async_client_s_operator_calls_reach_the_server(live: Server) -> None:
    async def run() -> None:
        async with AsyncClient(live.url, TOKEN) as kb:
            experts = await kb.experts()
            assert experts and {"id", "name"} <= set(experts[0])
            versions = await kb.router_versions()
            assert versions and "id" in versions[0]
            page = await kb.documents(limit=2)
            assert page["total"] >= 1 and len(page["items"]) <= 2
            assert (await kb.clusters(experts[0]["id"])) == [
                c for c in await kb.clusters() if c["expert_id"] == experts[0]["id"]
            ]

    asyncio.run(run())
