import json
from pathlib import Path

import pytest

from app.cli.main import collect_files, main
from app.cli.sample import build_sample_corpus
from tests.helpers import topic_doc


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    main(list(argv))
    return capsys.readouterr().out


def test_ingest_names_what_it_skips_and_sources_files_by_their_folder(tmp_path: Path) -> None:
    from app.cli.main import collect

    docs = tmp_path / "handbook"
    (docs / "sub").mkdir(parents=True)
    (docs / "a.md").write_text("# A\n\ntext")
    (docs / "sub" / "b.docx").write_bytes(b"PK")
    (docs / "sub" / "image.png").write_bytes(b"\x89PNG")
    (docs / "link.md").symlink_to(docs / "a.md")
    single = tmp_path / "single.txt"
    single.write_text("one file")
    files, sources, skipped = collect([str(docs), str(single)])
    assert len(files) == 3
    assert sources == ["handbook/a.md", "handbook/sub/b.docx", str(single)]
    assert [(Path(p).name, "unsupported type (.png)" in r or "symbolic link" in r) for p, r in skipped] == [
        ("image.png", True),
        ("link.md", True),
    ]


@pytest.mark.slow  # each command starts a runtime of its own (a model load)
def test_ingest_folder_twice_then_rebuild_and_search(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MOERAG_ADMIN_TOKEN", "t")
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / ".hidden").mkdir()
    for i, t in enumerate(["sqlite", "git", "debian"]):
        (docs / f"{t}.md").write_text(topic_doc(t, i))
    (docs / "sub" / "python.txt").write_text(topic_doc("python", 9))
    (docs / "sub" / "image.png").write_bytes(b"\x89PNG")  # skipped: unsupported type in a folder
    (docs / ".hidden" / "secret.txt").write_text("not for the index")
    assert len(collect_files([str(docs)])) == 4

    data = str(tmp_path / "data")
    first = json.loads(run(capsys, "--data-dir", data, "ingest", "--quiet", str(docs)).strip().splitlines()[-1])
    assert first["created"] == 4 and first["chunks"] >= 4
    assert first["skipped"] == 1  # sub/image.png, named on stderr (test_ingest_names_what_it_skips)
    second = json.loads(run(capsys, "--data-dir", data, "ingest", "--quiet", str(docs)).strip().splitlines()[-1])
    assert second == {"created": 0, "duplicate": 4, "failed": 0, "chunks": 0, "skipped": 1}

    rebuilt = json.loads(run(capsys, "--data-dir", data, "index", "rebuild").strip().splitlines()[-1])
    assert rebuilt["vectors"] == first["chunks"]
    out = run(capsys, "--data-dir", data, "search", "git rebase and merge", "-k", "1")
    assert "git.md" in out
    recl = json.loads(run(capsys, "--data-dir", data, "recluster").strip().splitlines()[-1])
    assert recl["clusters"] == 1 and recl["chunks"] == first["chunks"]  # too small to split
    assert "upgraded" in run(capsys, "--data-dir", data, "db", "upgrade")

    # Ask before two experts own lists: the fallback says why.
    answer = json.loads(run(capsys, "--data-dir", data, "ask", "--json", "git rebase and merge").splitlines()[-1])
    assert answer["route"]["reason"] == "one_expert" and answer["citations"]
    with pytest.raises(SystemExit, match="map at least one cluster"):
        main(["--data-dir", data, "router", "train"])
    from sqlalchemy import select

    from app.core.db import make_engine, make_sessionmaker
    from app.core.models import Chunk, Document
    from app.services.experts import assign_clusters, create_expert

    engine = make_engine(f"sqlite:///{data}/moerag.db")
    with make_sessionmaker(engine).begin() as s:
        expert = create_expert(s, {"name": "everything"})
        assign_clusters(s, [0], expert.id)
    engine.dispose()
    # One expert: no gate to train, and no accuracy or confidence claimed.
    with pytest.raises(SystemExit, match="no gate to train"):
        main(["--data-dir", data, "router", "train"])
    answer = json.loads(run(capsys, "--data-dir", data, "ask", "--json", "git rebase").splitlines()[-1])
    assert (answer["route"]["reason"], answer["route"]["confidence"]) == ("one_expert", None)
    labelled = tmp_path / "q.jsonl"
    labelled.write_text('{"question": "how do I merge branches?", "expert": "everything"}\n')
    with pytest.raises(SystemExit, match="no active router"):  # none was ever trained: nothing to score
        main(["--data-dir", data, "router", "eval", str(labelled)])

    # Two lists, two experts: a gate to train.
    assert json.loads(run(capsys, "--data-dir", data, "recluster", "--clusters", "2").splitlines()[-1])["clusters"] == 2
    engine = make_engine(f"sqlite:///{data}/moerag.db")
    with make_sessionmaker(engine).begin() as s:
        git_list = s.scalar(select(Chunk.cluster_id).join(Document).where(Document.source.endswith("git.md")))
        assert git_list is not None
        assign_clusters(s, [git_list], expert.id)
        assign_clusters(s, [1 - git_list], create_expert(s, {"name": "the rest"}).id)
    engine.dispose()
    trained = json.loads(run(capsys, "--data-dir", data, "router", "train").strip().splitlines()[-1])
    assert trained["active"] and trained["version"] == 1
    answer = json.loads(run(capsys, "--data-dir", data, "ask", "--json", "git rebase").splitlines()[-1])
    assert answer["route"]["path"] == "expert" and answer["route"]["expert"]["name"] == "everything"
    ev = json.loads(run(capsys, "--data-dir", data, "router", "eval", str(labelled)).splitlines()[-1])
    assert ev["questions"] == 1 and ev["accuracy"] == 1.0
    engine = make_engine(f"sqlite:///{data}/moerag.db")
    with make_sessionmaker(engine).begin() as s:  # back to one expert: no accuracy is claimed
        assign_clusters(s, [1 - git_list], None)
    engine.dispose()
    with pytest.raises(SystemExit, match="fewer than two experts own lists"):
        main(["--data-dir", data, "router", "eval", str(labelled)])


def test_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no such file"):
        main(["--data-dir", str(tmp_path / "d"), "ingest", str(tmp_path / "nope")])


def test_sample_corpus_is_built_from_pydoc(tmp_path: Path) -> None:
    paths = build_sample_corpus(tmp_path, modules=("json", "csv", "heapq", "no_such_module_xyz"))
    assert sorted(p.name for p in paths) == ["csv.md", "heapq.md", "json.html"]
    assert "JSONDecoder" in (tmp_path / "json.html").read_text()


def test_files_the_server_places_itself_keep_no_server_path(runtime, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue 11 #5: the sample corpus's sources were absolute paths under the data dir."""
    from app.cli.main import ingest_files

    folder = tmp_path / "sample-corpus"
    paths = build_sample_corpus(folder, modules=("json",))
    ingest_files(runtime, paths, progress=False, root=folder)
    docs = runtime.stats()["documents"]
    assert docs == len(paths)
    from sqlalchemy import select

    from app.core.models import Document

    with runtime.sessions() as s:
        sources = list(s.scalars(select(Document.source)))
    assert sources and not any(src.startswith("/") or str(tmp_path) in src for src in sources)


def test_data_dir_is_taken_after_the_subcommand_too() -> None:
    """Issue 40 #6: `moerag ask --data-dir d …` was refused; it now means what `moerag --data-dir d ask …` does."""
    from app.cli.main import build_parser

    parser = build_parser()
    assert parser.parse_args(["ask", "--data-dir", "d", "q"]).data_dir == "d"
    assert parser.parse_args(["--data-dir", "d", "ask", "q"]).data_dir == "d"  # not reset by the subcommand
    assert parser.parse_args(["index", "rebuild", "--data-dir", "e"]).data_dir == "e"
    assert parser.parse_args(["search", "q"]).data_dir is None


@pytest.mark.parametrize("command", [["ask", "what is git?"], ["search", "git"]])
def test_a_read_command_without_a_store_says_so_and_creates_nothing(tmp_path: Path, command: list[str]) -> None:
    """Issue 40 #6: `moerag ask` in a folder with no store created an empty one and answered "No passages"."""
    empty = tmp_path / "nothing-here"
    with pytest.raises(SystemExit, match=r"no store in .*ingest documents first"):
        main(["--data-dir", str(empty), *command])
    assert not empty.exists()


def test_search_prints_a_snippet_of_each_hit(capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli.remote import print_hits, snippet

    hit = {
        "score": 0.5,
        "chunk_id": 7,
        "source": "git.md",
        "heading": "Branches",
        "text": "A branch\n is " + "x " * 200,
    }
    print_hits({"hits": [hit], "vectors_scanned": 1, "clusters_scanned": 1}, as_json=False)
    out = capsys.readouterr().out.splitlines()
    assert out[1].strip().startswith("A branch is x x") and out[1].endswith("…") and len(out[1]) < 180
    assert snippet("short  text") == "short text"
