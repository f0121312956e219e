"""The peer comparison (benchmarks/compare.py) end to end on a tiny corpus, so it keeps working.

Every stage runs for real: moerag ingestion, the LangChain FAISS pipeline, semantic-router
fitted on moerag's samples, a real `moerag serve` under the load generator, synthetic scaling,
and the report with its PNG plots. The peers come with the `dev` extra, so this never skips.
The figures are too small to mean anything; the test checks that each stage produced sane,
internally consistent results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Three domains of the eval layout (the folder decides the domain), two pages each.
PAGES = {
    "python3.11-doc/html/faq/general.html": [
        (
            "Why indentation",
            "Python uses indentation to group statements because it makes the visual "
            "structure of a program match its real structure, so blocks never disagree with braces.",
        ),
        (
            "Speed",
            "CPython compiles source code to bytecode and interprets it; tight numeric loops run "
            "faster with NumPy arrays or a C extension module than in pure interpreted code.",
        ),
    ],
    "python3.11-doc/html/library/json.html": [
        (
            "json.dumps",
            "The json module serialises Python dictionaries and lists to JSON text with dumps "
            "and parses JSON strings back into Python objects with loads.",
        ),
    ],
    "git-doc/git-revert.html": [
        (
            "Description",
            "git revert records a new commit that undoes the changes introduced by an earlier "
            "commit, leaving the history intact, which is safe on branches others have pulled.",
        ),
    ],
    "git-doc/gitfaq.html": [
        (
            "Credentials",
            "Git can cache your HTTPS credentials in memory with the credential cache helper so "
            "that you do not have to type your password for every push to the remote repository.",
        ),
    ],
    "sqlite3/faq.html": [
        (
            "Autoincrement",
            "Declare a column INTEGER PRIMARY KEY and SQLite fills it with a unique rowid "
            "automatically whenever you insert a row without giving that column a value.",
        ),
    ],
    "sqlite3/lang_vacuum.html": [
        (
            "VACUUM",
            "The VACUUM command rebuilds the database file, repacking it into a minimal amount of disk "
            "space and removing the free pages left behind by deleted tables and indexes.",
        ),
    ],
}

QUESTIONS = [
    ("python", "python3.11-doc/html/faq/general.html", "Why does Python use indentation for grouping?", 0),
    ("git", "git-doc/git-revert.html", "How do I undo a commit that was already pushed?", 0),
    ("sqlite", "sqlite3/faq.html", "How do I create an autoincrement field?", 0),
    ("sqlite", "sqlite3/lang_vacuum.html", "How do I shrink the database file after deleting data?", 0),
]


def write_corpus(root: Path) -> Path:
    corpus = root / "corpus"
    for rel, sections in PAGES.items():
        body = "".join(f"<h2>{h}</h2><p>{text}</p>" for h, text in sections)
        path = corpus / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"<html><head><title>{rel}</title></head><body><h1>{rel}</h1>{body}</body></html>")
    qfile = root / "questions.jsonl"
    with qfile.open("w") as f:
        for i, (domain, source, question, section) in enumerate(QUESTIONS):
            answer = PAGES[source][section][1]
            row = {"id": f"q{i}", "domain": domain, "question": question, "answer": answer, "source": source}
            f.write(json.dumps(row | {"anchor": ""}) + "\n")
    return corpus


@pytest.mark.slow  # the comparison script and its peers
def test_compare_runs_every_stage(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path)
    results = tmp_path / "results"
    cmd = [
        sys.executable,
        "benchmarks/compare.py",
        "--work",
        str(tmp_path / "work"),
        "--corpus",
        str(corpus),
        "--questions",
        str(tmp_path / "questions.jsonl"),
        "--results",
        str(results),
        "--stages",
        "ingest",
        "peer",
        "quality",
        "speed",
        "load",
        "scaling",
        "report",
        "--speed-pages",
        "3",
        "--load-requests",
        "6",
        "--load-levels",
        "1",
        "2",
        "--load-targets",
        "moerag, batching",
        "LangChain server",
        "--sizes",
        "3000",
        "--latency-questions",
        "2",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MOERAG_CLUSTERS": "3", "MOERAG_ROUTER_SAMPLES": "300"}
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    merged = json.loads((results / "compare.json").read_text())
    quality = merged["quality"]
    assert quality["corpus"]["questions"] == len(QUESTIONS)
    names = set(quality["retrieval"])
    assert {
        "global dense (exact)",
        "LangChain FAISS RAG (tutorial defaults)",
        "moerag retrieval, semantic-router gate",
    } <= names
    for m in quality["retrieval"].values():
        assert 0 <= m["hit@1"] <= m["hit@5"] <= m["hit@10"] <= 1
    # Each answer is one short section of a six-page corpus: exact search must find every one.
    assert quality["retrieval"]["global dense (exact)"]["hit@10"] == 1.0
    assert quality["retrieval"]["LangChain FAISS RAG (tutorial defaults)"]["hit@10"] == 1.0
    assert quality["peer_corpus"]["langchain_chunks"] >= len(PAGES)
    assert 0 <= quality["semantic_router"]["expert_path_share"] <= 1

    speed = merged["speed"]
    assert speed["pages"] == 3 and speed["moerag"]["chunks"] > 0 and speed["LangChain"]["chunks"] > 0

    load = merged["load"]
    levels = load["levels"]
    dtype = load["bare_encode_search"]["dtype"]
    # Both servers stay up; at each client count they take turns, so a ratio compares neighbours in time.
    assert [(lv["target"], lv["clients"], lv["round"]) for lv in levels] == [
        ("moerag, batching", 1, 1),
        (f"LangChain server ({dtype})", 1, 1),
        ("moerag, batching", 2, 1),
        (f"LangChain server ({dtype})", 2, 1),
    ]
    for lv in levels:
        assert lv["errors"] == {} and lv["requests"] == 6
        assert lv["p50_ms"] <= lv["p95_ms"] <= lv["p99_ms"]
        assert 0 < lv["loadgen_cpu_share"] <= 1
    assert load["bare_encode_search"]["p50_ms"] > 0
    # The floor taken again next to the 1-client round, carried by that round's rows (and only theirs).
    assert [lv["clients"] for lv in levels if lv.get("bare_p50_ms", 0) > 0] == [1, 1]
    assert "p50_at_1_client_over_bare_ms" in load
    assert "ratio_at_8_clients" not in load  # no level at 8 clients in this short run

    (row,) = merged["scaling"]["rows"]
    assert row["chunks"] == 3000 and row["global"]["scanned"] == 3000
    assert row["expert path, all its lists"]["scanned"] < 3000
    assert row["expert path, nearest 16 of its lists"]["scanned"] <= row["expert path, all its lists"]["scanned"]

    for png in merged["plots"]:
        assert (results / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "LangChain" in (results / "compare.md").read_text()


def test_the_load_summary_sets_the_p95_aim_beside_littles_law() -> None:
    """8 closed-loop clients at twice one client's throughput wait four times as long on average."""
    from benchmarks.load import summary  # the repository root is on the path: tests/ is a package

    def row(clients: int, rps: float, p50: float, p95: float, **kw: float) -> dict[str, object]:
        return {
            "target": "moerag, batching",
            "clients": clients,
            "round": 1,
            "throughput_rps": rps,
            "p50_ms": p50,
            "p95_ms": p95,
            **kw,
        }

    out = summary([row(1, 50.0, 20.0, 25.0, bare_p50_ms=15.0), row(8, 100.0, 80.0, 100.0)], {"p50_ms": 14.0})
    assert out["p50_at_1_client_over_bare_ms"] == 5.0 and out["p95_8_over_p95_1"] == 4.0
    assert out["throughput_8_over_1"] == 2.0 and out["mean_latency_8_over_1_by_littles_law"] == 4.0
    assert "ratio_at_8_clients" not in out  # no LangChain rows


def test_the_expert_path_is_right_where_the_answer_page_sits() -> None:
    """A route counts as right on the page's expert, whatever the domain; fallbacks do not count."""
    from types import SimpleNamespace

    from benchmarks.routing_report import right_page_on_path

    def route(path: str, expert: int | None) -> SimpleNamespace:
        return SimpleNamespace(path=path, expert=SimpleNamespace(id=expert) if expert is not None else None)

    routes = [route("expert", 3), route("expert", 2), route("fallback", None), route("expert", 4)]
    assert right_page_on_path(routes, [3, 5, 2, 4]) == round(2 / 3, 3)
    assert right_page_on_path([route("fallback", None)], [1]) == 0.0


def test_route_losses_list_the_questions_the_modes_disagree_on_with_their_route() -> None:
    from types import SimpleNamespace

    from benchmarks.routing_report import route_losses

    python, sqlite = SimpleNamespace(name="python"), SimpleNamespace(name="sqlite")
    confident = SimpleNamespace(
        path="expert", reason="confident", expert=sqlite, confidence=0.7661, top=[(sqlite, 0.7661), (python, 0.2)]
    )
    unsure = SimpleNamespace(path="fallback", reason="low_confidence", expert=None, confidence=0.5, top=[(None, 0.5)])
    questions = [{"id": f"q{i}", "domain": "python", "question": f"question {i}"} for i in range(3)]
    firsts = {"routed": [None, 3, 1], "hybrid": [2, 3, 1], "oracle": [2, 3, 1]}
    (loss,) = route_losses(questions, [confident, unsure, unsure], firsts)  # q1 and q2: all agree
    assert loss["id"] == "q0" and loss["expert"] == "sqlite" and loss["confidence"] == 0.766
    assert loss["top"] == [("sqlite", 0.766), ("python", 0.2)] and loss["first_hit"] == {
        "routed": None,
        "hybrid": 2,
        "oracle": 2,
    }


def test_miss_anatomy_tells_ranking_losses_from_routing_ones() -> None:
    """Each miss of routed's top 10 is counted once: right expert, another expert or the fallback,
    by how deep its answer sits on that path; hits are not counted."""
    from types import SimpleNamespace

    from benchmarks.routing_report import _anatomy, miss_anatomy

    def route(path: str, expert: int | None, reason: str = "confident") -> SimpleNamespace:
        return SimpleNamespace(path=path, reason=reason, expert=SimpleNamespace(id=expert) if expert else None)

    routes = [
        route("expert", 1),
        route("expert", 1),
        route("expert", 2),
        route("fallback", None, "low_confidence"),
        route("expert", 1),
        route("expert", 2),
    ]
    pages = [1, 1, 1, 2, 1, 1]
    routed_first = [None, None, None, None, 4, 2]  # the last two are hits: whatever their route, not counted
    deeper = {0: 12, 1: None, 2: None, 3: 55}
    a = miss_anatomy(routes, pages, routed_first, deeper)
    assert (a["misses"], a["questions"], a["right_expert"], a["misrouted"], a["fallback"]) == (4, 6, 2, 1, 1)
    assert a["right_expert_ranks"] == {"11-20": 1, "21-50": 0, "51-100": 0, "beyond 100": 1}
    assert a["misrouted_ranks_there"]["beyond 100"] == 1 and a["fallback_ranks"]["51-100"] == 1
    assert a["fallback_reasons"] == {"low_confidence": 1}
    table = _anatomy(a)
    assert (
        "| routed's 4 misses of 6 | questions | first hit on that path: 11-20 | 21-50 | 51-100 | beyond 100 |" in table
    )
    assert "| sent to the expert holding the answer's page | 2 | 1 | 0 | 0 | 1 |" in table
    assert "| answered by the fallback (low_confidence 1) | 1 | 0 | 0 | 1 | 0 |" in table


def test_a_miss_is_asked_again_deeper_on_the_path_it_took() -> None:
    """`rank_on_path`: the same expert (forced) or the fallback, MISS_DEPTH deep; a hit below the
    top 10 is found at its rank, none is None."""
    from types import SimpleNamespace

    from benchmarks.routing import rank_on_path
    from benchmarks.routing_report import MISS_DEPTH

    answer = "the conffile is a configuration file that dpkg will not overwrite on upgrade without asking"
    q = {"question": "What is a conffile?", "answer": answer, "source": "debian/FAQ/pkg-basics.en.html"}
    asked: list[Any] = []

    def prepare(req: Any) -> SimpleNamespace:
        asked.append(req)
        other = [
            SimpleNamespace(chunk=SimpleNamespace(text=f"passage {n} on packages", source=q["source"]))
            for n in range(11)
        ]
        hit = SimpleNamespace(chunk=SimpleNamespace(text=answer, source=q["source"]))
        return SimpleNamespace(citations=[*other, hit] if req.mode == "expert" else other)

    rt = SimpleNamespace(pipeline=SimpleNamespace(prepare=prepare))
    on_expert = SimpleNamespace(path="expert", expert=SimpleNamespace(id=7))
    assert rank_on_path(rt, q, on_expert) == 12
    assert rank_on_path(rt, q, SimpleNamespace(path="fallback", expert=None)) is None
    assert [(r.mode, r.expert_id, r.top_k) for r in asked] == [
        ("expert", 7, MISS_DEPTH),
        ("fallback", None, MISS_DEPTH),
    ]


@pytest.mark.slow  # the routing script
def test_routing_scores_more_question_sets_in_the_same_run(tmp_path: Path) -> None:
    """`routing.py --also`: another question set, scored on the same store and router after the main one."""
    corpus = write_corpus(tmp_path)
    questions = tmp_path / "questions.jsonl"
    also = tmp_path / "unseen-tiny.jsonl"
    also.write_text("".join(line for line in questions.read_text().splitlines(keepends=True)[:2]))
    results = tmp_path / "results"
    cmd = [sys.executable, "benchmarks/routing.py", "--data-dir", str(tmp_path / "data"), "--corpus", str(corpus)]
    cmd += ["--questions", str(questions), "--no-faq-blind", "--no-reference", "--latency-questions", "0"]
    cmd += ["--name", "tiny", "--results", str(results), "--also", str(also), str(questions)]  # itself: skipped
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MOERAG_CLUSTERS": "3", "MOERAG_ROUTER_SAMPLES": "300"}
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    result = json.loads((results / "tiny.json").read_text())
    assert result["corpus"]["questions"] == len(QUESTIONS)
    (name, sub), *rest = result["also"].items()
    assert name == "unseen-tiny" and not rest and sub["questions_file"] == str(also)
    assert sub["corpus"]["questions"] == 2 and sub["corpus"]["chunks"] == result["corpus"]["chunks"]
    assert sub["router"]["version"] == result["router"]["version"]  # the router the main run trained
    assert result["leakage"] is not None and sub["leakage"] is None  # the store was mapped and measured once
    assert sub["retrieval"]["global dense (exact)"]["hit@10"] == 1.0  # one short section each: found
    assert "### Also: unseen-tiny (2 questions" in (results / "tiny.md").read_text()
    for r in (result, sub):  # every set says where its misses are: routed's own, not another mode's
        a = r["miss_anatomy"]
        assert a["questions"] == r["corpus"]["questions"]
        assert a["misses"] == round((1 - r["retrieval"]["routed (served pipeline)"]["hit@10"]) * a["questions"])


@pytest.mark.slow  # the routing script
def test_routing_refuses_two_question_sets_of_one_name_before_any_work(tmp_path: Path) -> None:
    """Results are keyed by file name: a second `x.jsonl` would silently replace the first."""
    sets = [tmp_path / d / "x.jsonl" for d in ("a", "b")]
    cmd = [sys.executable, "benchmarks/routing.py", "--data-dir", str(tmp_path / "data"), "--also", *map(str, sets)]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "two sets share a file name" in run.stderr
    assert not (tmp_path / "data").exists()  # refused before a store was opened


def test_ray_scale_spreads_experts_largest_first_onto_the_lightest_shard() -> None:
    from benchmarks.ray_scale import spread

    shard_map = spread({"a": 10, "b": 6, "c": 5, "d": 1}, 2, replicas=2)
    assert [s.experts for s in shard_map.shards] == [("a", "d"), ("b", "c")]  # 11 vectors each
    assert [s.default for s in shard_map.shards] == [True, False] and {s.replicas for s in shard_map.shards} == {2}


def test_the_capacity_projection_scales_the_measured_cost_by_the_vectors_scanned() -> None:
    from benchmarks.capacity import project

    row = project({"x": {"bytes_per_vector": 100.0, "ns_per_vector_scanned": 10.0}})["50M"]
    assert row["lists"] == 7071 and row["routed_vectors_scanned"] == round(32 * 50e6 / 7071)
    x = row["encodings"]["x"]
    assert x["memory_gib"] == round(50e6 * 100 / 2**30, 1) and x["exact_fallback_ms_one_core"] == 500.0
    assert x["cores_for_500_routed_q_per_s_with_check"] == round(500 * 40 * 50e6 / 7071 * 10 / 1e9, 1)


def test_the_gpu_pipeline_check_forgives_only_the_order_of_tied_chunks() -> None:
    from benchmarks.gpu_pipeline import same_answer

    want = {"path": "expert", "expert": 2, "ids": [5, 7, 9, 11], "scores": [0.9, 0.8, 0.8, 0.7]}
    assert same_answer(want, want | {"ids": [5, 9, 7, 11]})  # a tie in another order
    assert same_answer(want, want | {"ids": [5, 7, 9, 12]})  # the last place's tie: another chunk of that score
    assert not same_answer(want, want | {"ids": [7, 5, 9, 11]})  # no tie between 5 and 7
    assert not same_answer(want, want | {"ids": [5, 7, 10, 11]})  # another chunk inside the list
    assert not same_answer(want, want | {"scores": [0.9, 0.8, 0.8, 0.69]})
    assert not same_answer(want, want | {"path": "fallback"})
