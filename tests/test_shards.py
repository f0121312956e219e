"""Expert shards (index.shards): an index carved by expert into shards answers every search as the
whole index does, and a confident question's search touches only its expert's shard."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from engine.pipeline import AskRequest
from engine.postings import Postings
from engine.sharded_lexical import ShardedLexical, local_lexical, local_search_with_bm25
from index import ClusteredIndex
from index.list_map import ListMap
from index.shards import ROWS_A_CALL, ShardedIndex, carve, local_rows, local_search, merge_topk, shard_of_lists
from tests.conftest import AUTH
from tests.helpers import TOPICS


def test_merge_topk_keeps_the_best_k_of_the_union_and_pads_like_faiss() -> None:
    a = (np.array([[0.9, 0.5, -np.inf]], dtype=np.float32), np.array([[1, 5, -1]]))
    b = (np.array([[0.7, 0.5, 0.1]], dtype=np.float32), np.array([[3, 2, 4]]))
    scores, ids = merge_topk([a, b], 4)
    assert ids.tolist() == [[1, 3, 2, 5]]  # the tie at 0.5: the lower id first
    assert scores[0].tolist() == pytest.approx([0.9, 0.7, 0.5, 0.5])
    scores, ids = merge_topk([a], 4)  # fewer candidates than k: padded with (-inf, -1)
    assert ids.tolist() == [[1, 5, -1, -1]] and np.isneginf(scores[0, 2:]).all()
    moving = (np.array([[0.7, 0.6]], dtype=np.float32), np.array([[3, 6]]))  # id 3 found by two shards
    scores, ids = merge_topk([a, b, moving], 5)
    assert ids.tolist() == [[1, 3, 6, 2, 5]] and scores[0].tolist() == pytest.approx([0.9, 0.7, 0.6, 0.5, 0.5])


def test_a_carved_index_holds_exactly_its_lists_and_searches_them_identically() -> None:
    rng = np.random.default_rng(7)
    centroids = rng.normal(size=(6, 8)).astype(np.float32)
    x = rng.normal(size=(300, 8)).astype(np.float32)
    whole = ClusteredIndex.create(centroids, "v")
    whole.add(x, np.arange(300) + 10, whole.assign(x))
    shard = shard_of_lists([1, 1, 2, None, 3, 2], {1: 0, 2: 1, 3: 2}, default=0)
    assert shard.tolist() == [0, 0, 1, 0, 2, 1]
    parts = [carve(whole, np.flatnonzero(shard == s)) for s in range(3)]
    assert sum(p.ntotal for p in parts) == whole.ntotal
    ids, lists = whole.assignments()
    for s, p in enumerate(parts):
        p_ids, p_lists = p.assignments()
        assert np.array_equal(p_ids, ids[shard[lists] == s]) and (shard[p_lists] == s).all()
    sharded = ShardedIndex(whole, [np.flatnonzero(shard == s) for s in range(3)], [local_search(p) for p in parts])
    q = rng.normal(size=(20, 8)).astype(np.float32)
    for scope in (None, [0, 1], [2, 5], [4], [0, 2, 4]):
        expect, got = whole.search(q, 10, scope), sharded.search(q, 10, scope)
        assert np.array_equal(expect[1], got[1]), scope
        assert np.array_equal(expect[0][expect[1] >= 0], got[0][got[1] >= 0]), scope
    assert np.array_equal(sharded.clusters_of(ids), lists) and np.array_equal(sharded.list_sizes(), whole.list_sizes())
    assert sharded.shards_of([0, 1]) == [0] and sharded.shards_of(None) == [0, 1, 2]
    # Over the index's ListMap (no vectors) with the shards' row search: the batched probes (a
    # router's, a new document's fit against the content up to an id) equal the whole index's.
    skeleton = ListMap.of(whole)
    sharded = ShardedIndex(
        skeleton,
        [np.flatnonzero(shard == s) for s in range(3)],
        [local_search(p) for p in parts],
        rows=[local_rows(p) for p in parts],
    )
    assert np.array_equal(sharded.search(q, 10)[1], whole.search(q, 10)[1])
    for nprobe in (1, 3, 6):
        expect_nearest, got_nearest = whole.search_nearest(q, 5, nprobe), sharded.search_nearest(q, 5, nprobe)
        assert np.array_equal(expect_nearest[1], got_nearest[1]) and expect_nearest[2] == got_nearest[2]
        assert np.allclose(expect_nearest[0], got_nearest[0])
        for through in (None, 150):
            expect, got = whole.neighbours(q, 4, nprobe, through), sharded.neighbours(q, 4, nprobe, through)
            assert np.array_equal(expect[1], got[1]) and np.allclose(expect[0], got[0]), (nprobe, through)
    assert sharded.calls == [1 + 3 * 3] * 3  # one call a shard for all 20 rows of each probe
    many = rng.normal(size=(600, 8)).astype(np.float32)  # sent in calls of at most ROWS_A_CALL rows
    calls = list(sharded.calls)
    assert np.array_equal(sharded.search_nearest(many, 5, 2)[1], whole.search_nearest(many, 5, 2)[1])
    assert [c - b for c, b in zip(sharded.calls, calls, strict=True)] == [-(-600 // ROWS_A_CALL)] * 3


def test_a_list_map_keeps_the_index_facts_and_writes_without_the_vectors() -> None:
    rng = np.random.default_rng(8)
    centroids = rng.normal(size=(5, 8)).astype(np.float32)
    x = rng.normal(size=(200, 8)).astype(np.float32)
    whole = ClusteredIndex.create(centroids, "v")
    ids = rng.permutation(1000)[:200].astype(np.int64)
    whole.add(x, ids, whole.assign(x))
    skeleton = ListMap.of(whole)
    held = skeleton.assignments()
    before = [a.copy() for a in held]
    extra = rng.normal(size=(30, 8)).astype(np.float32)
    for index in (whole, skeleton):
        index.remove([*ids[:40].tolist(), 5000])  # an absent id is ignored
        index.add(extra, np.arange(2000, 2030), index.assign(extra))
    for got, want in zip(skeleton.assignments(), whole.assignments(), strict=True):
        assert np.array_equal(got, want)
    assert np.array_equal(skeleton.list_sizes(), whole.list_sizes()) and skeleton.ntotal == whole.ntotal == 190
    probe = np.concatenate([ids[:50], [2001, 7, -1]])
    assert np.array_equal(skeleton.clusters_of(probe), whole.clusters_of(probe))
    assert skeleton.scan_size([0, 3]) == whole.scan_size([0, 3]) and skeleton.probe_budget(4) == whole.probe_budget(4)
    assert np.array_equal(skeleton.nearest_lists(x[0], range(5), 2), whole.nearest_lists(x[0], range(5), 2))
    assert all(np.array_equal(a, b) for a, b in zip(held, before, strict=True))  # a state's view never moves
    with pytest.raises(ValueError, match="out of range"):
        skeleton.add(None, np.array([1]), np.array([9]))


def test_shards_answering_at_different_versions_are_brought_to_one_cut() -> None:
    """A chunk moving from shard 0's list to shard 1's: shard 0 has applied the move (version 7),
    shard 1 not yet (5). Shard 1 is asked again at version 7, so the chunk is found; shards at one
    version, or answering without versions, are asked once."""
    from concurrent.futures import Future

    from index.shards import Answer

    centroids = np.eye(4, dtype=np.float32)[:2]  # [2, 4]: list 0 on shard 0, list 1 on shard 1
    skeleton = ClusteredIndex.create(centroids, "v")
    moving = np.array([[0.6, 0.8, 0.0, 0.0]], dtype=np.float32)
    skeleton.add(moving, np.array([42]), np.array([1]))  # where it is now
    left, entered = ClusteredIndex.create(centroids, "v"), ClusteredIndex.create(centroids, "v")
    entered.add(moving, np.array([42]), np.array([1]))
    asked: list[tuple[int, int | None]] = []

    def shard(n: int, version: int) -> Any:
        def search(q: Any, k: int, lists: Any, at_least: int | None = None) -> Future[Answer]:
            asked.append((n, at_least))
            at = max(version, at_least or 0)
            part = left if n == 0 or at < 7 else entered  # shard 1 holds the chunk from version 7 on
            done: Future[Answer] = Future()
            done.set_result((*part.search(q, k, lists), at, at))
            return done

        return search

    q = np.array([[1.0, 1.0, 0.0, 0.0]], dtype=np.float32)
    lists = [np.array([0]), np.array([1])]
    sharded = ShardedIndex(skeleton, lists, [shard(0, 7), shard(1, 5)])
    assert sharded.search(q, 3)[1][0].tolist() == [42, -1, -1]
    assert asked == [(0, None), (1, None), (1, 7)] and sharded.reasked == 1
    asked.clear()
    level = ShardedIndex(skeleton, lists, [shard(0, 7), shard(1, 7)])
    assert level.search(q, 3)[1][0].tolist() == [42, -1, -1] and len(asked) == 2 and level.reasked == 0
    plain = ShardedIndex(skeleton, lists, [local_search(left), local_search(left)])
    assert plain.search(q, 3)[1][0].tolist() == [-1, -1, -1] and plain.reasked == 0  # no versions: as answered


def test_several_searches_over_shards_travel_together() -> None:
    """`search_each` (a confident question's scoped search and its route check's probe) sends
    every shard call before awaiting any answer: one round trip; results as `search` gives them."""
    rng = np.random.default_rng(5)
    centroids = rng.normal(size=(6, 8)).astype(np.float32)
    x = rng.normal(size=(200, 8)).astype(np.float32)
    whole = ClusteredIndex.create(centroids, "v")
    whole.add(x, np.arange(200), whole.assign(x))
    lists = [np.array([0, 1, 2]), np.array([3, 4, 5])]
    events: list[str] = []

    def shard(part: ClusteredIndex, name: str) -> Any:
        search = local_search(part)

        class Recorded:
            def __init__(self, pending: Any) -> None:
                self.pending = pending

            def result(self) -> Any:
                events.append(f"await {name}")
                return self.pending.result()

        def send(q: Any, k: int, its_lists: Any, at_least: int | None = None) -> Any:
            events.append(f"send {name}")
            return Recorded(search(q, k, its_lists, at_least))

        return send

    sharded = ShardedIndex(whole, lists, [shard(carve(whole, ls), f"s{i}") for i, ls in enumerate(lists)])
    q = x[:1]
    got = sharded.search_each(q, [(10, [0, 1]), (1, [4, 5])])  # the expert's lists on s0, the probe's on s1
    assert events == ["send s0", "send s1", "await s0", "await s1"]
    for (k, scope), (scores, ids) in zip([(10, [0, 1]), (1, [4, 5])], got, strict=True):
        expect = whole.search(q, k, scope)
        assert np.array_equal(ids, expect[1]) and np.allclose(scores[ids >= 0], expect[0][expect[1] >= 0])


def _questions() -> list[str]:
    sentences = [s.strip().rstrip(".") for text in TOPICS.values() for s in text.split(". ") if s.strip()]
    forms = [
        "{}",
        "how {}?",
        "why {}?",
        "what does it mean that {}?",
        "explain: {}",
        "is it true that {}?",
        "in short: {}",
        "a question about this: {}",
    ]
    return [f.format(s) for s in sentences for f in forms]


def test_the_ask_flow_over_expert_shards_equals_the_whole_index(client: TestClient, routed: dict[str, Any]) -> None:
    """Three shards by expert (git; sqlite; debian with the lists no expert owns): every answer's
    route, ids and scores equal the single index's, routed and fallback; a confident route's
    search goes to its expert's shard alone."""
    from app.serving.lexical import build_with_sample

    rt = client.app.state.runtime  # type: ignore[attr-defined]
    # The route reads a central sample (as a server over shards does by default), in both: the
    # store is small, so it is sampled whole.
    *_, sample = build_with_sample(rt.sessions, False, 0.05)
    state = dataclasses.replace(rt.state(), sample=sample)
    experts = routed["experts"]
    owners: list[int | None] = [None] * state.index.nlist
    for eid, profile in state.experts.items():
        for c in profile.clusters:
            owners[c] = eid
    shard = shard_of_lists(owners, {experts["git"]: 0, experts["sqlite"]: 1, experts["debian"]: 2}, default=2)
    lists = [np.flatnonzero(shard == s) for s in range(3)]
    parts = [carve(state.index, ls) for ls in lists]
    assert sum(p.ntotal for p in parts) == state.index.ntotal
    # BM25 on the shards too: each part's postings, scored with the whole store's statistics; a
    # search carrying the question's weights brings its chunks' scores and its lists' best.
    records = rt.pipeline.store.fetch(state.index.assignments()[0].tolist())
    postings = [
        Postings(ids, [f"{records[i].heading}\n{records[i].text}" for i in ids])
        for ids in (p.assignments()[0].tolist() for p in parts)
    ]
    sharded = ShardedIndex(
        state.index, lists, [local_search_with_bm25(p, b) for p, b in zip(parts, postings, strict=True)]
    )
    asked = [0, 0, 0]  # BM25 calls each shard took

    def counted(n: int, ask: Any) -> Any:
        def call(*a: Any) -> Any:
            asked[n] += 1
            return ask(*a)

        return call

    # With the sample, BM25 asks no summary at a question's start: the searches bring their lists' best scores.
    assert state.sample is not None and len(state.sample) == state.index.ntotal
    lexical = ShardedLexical(
        state.lexical.stats,
        [counted(n, local_lexical(b, p)) for n, (b, p) in enumerate(zip(postings, parts, strict=True))],
        ["git", "sqlite", "debian"],
        sharded,
        summary=False,
    )
    whole = rt.pipeline
    over_shards = dataclasses.replace(state, index=sharded, lexical=lexical)
    questions = _questions()
    assert len(questions) >= 50
    compared = confident = 0
    for mode in ("auto", "fallback", "rrf"):  # rrf: the fallback fused by ranks (BM25's own top-k asked)
        whole.config.fusion = "rrf" if mode == "rrf" else "convex"
        mode = "fallback" if mode == "rrf" else mode
        for question in questions[:: 4 if whole.config.fusion == "rrf" else 1]:
            whole.state = lambda: state
            expect = whole.prepare(AskRequest(question, mode=mode))
            calls, bm25_calls = list(sharded.calls), list(asked)
            whole.state = lambda: over_shards  # type: ignore[assignment]
            got = whole.prepare(AskRequest(question, mode=mode))
            touched = [a - b + c - d for a, b, c, d in zip(sharded.calls, calls, asked, bm25_calls, strict=True)]
            assert (got.route.path, got.route.reason) == (expect.route.path, expect.route.reason), question
            assert [c.chunk.id for c in got.citations] == [c.chunk.id for c in expect.citations], question
            assert [c.score for c in got.citations] == pytest.approx([c.score for c in expect.citations], abs=1e-6)
            assert got.route.vectors_scanned == expect.route.vectors_scanned
            compared += 1
            if got.route.reason == "confident" and got.route.expert is not None:
                # One call to its expert's shard, no other shard asked: the gate's vote and the
                # route's check read the sample, and the search brings BM25's scores and scale.
                owner = {experts["git"]: 0, experts["sqlite"]: 1, experts["debian"]: 2}[got.route.expert.id]
                assert sharded.shards_of(got.route.expert.clusters) == [owner]
                assert touched == [int(n == owner) for n in range(3)], (question, touched)
                confident += 1
            elif got.route.path == "fallback" and got.route.reason in ("forced", "low_confidence") and mode != "rrf":
                assert touched == [1, 1, 1] or whole.config.fusion == "rrf", (question, touched)  # one round
    whole.state, whole.config.fusion = rt.services.states.current, "convex"
    assert compared >= 100
    assert confident >= 10, confident


def test_the_shard_map_is_checked_when_read_and_when_applied(tmp_path: Any) -> None:
    from pathlib import Path

    from app.shards.map import load, parse
    from engine.errors import InvalidSetting
    from engine.serving import ExpertProfile

    example = load(Path(__file__).resolve().parent.parent / "docs" / "shards.example.yaml")
    assert [s.name for s in example.shards] == ["code", "data", "rest"] and example.default == 2
    assert example.shards[0].replicas == 2 and len(example.version) == 12 and example.embedder is None
    with_model = parse({"shards": [{"name": "a", "default": True}], "embedder": {"replicas": 2}})
    assert with_model.embedder is not None and (with_model.embedder.replicas, with_model.embedder.max_batch) == (2, 16)
    served = parse({"shards": [{"name": "a", "default": True}], "ingress": {"replicas": 3, "port": 8123}})
    assert served.ingress is not None and (served.ingress.replicas, served.ingress.host) == (3, "127.0.0.1")
    scaled = parse({"shards": [{"name": "a", "default": True, "autoscaling": {"min_replicas": 1, "max_replicas": 3}}]})
    assert scaled.shards[0].autoscaling is not None and scaled.shards[0].autoscaling.target_ongoing_requests == 8.0
    bad = {
        "non-empty list": {"shards": []},
        "named twice": {"shards": [{"name": "a", "default": True}, {"name": "a"}]},
        "one shard": {
            "shards": [{"name": "a", "experts": ["git"], "default": True}, {"name": "b", "experts": ["git"]}]
        },
        "exactly one shard": {"shards": [{"name": "a"}]},
        "replicas": {"shards": [{"name": "a", "replicas": 0, "default": True}]},
        "'max_batch' is a whole number": {"shards": [{"name": "a", "default": True}], "embedder": {"max_batch": 0}},
        "a mapping of 'replicas'": {"shards": [{"name": "a", "default": True}], "embedder": {"gpus": 1}},
        "ingress: 'port' is a whole number": {"shards": [{"name": "a", "default": True}], "ingress": {"port": 0}},
        "'ingress' is a mapping": {"shards": [{"name": "a", "default": True}], "ingress": {"workers": 2}},
        "ingress: 'host'": {"shards": [{"name": "a", "default": True}], "ingress": {"host": " "}},
        "min_replicas <= max_replicas": {
            "shards": [{"name": "a", "default": True, "autoscaling": {"min_replicas": 3, "max_replicas": 2}}]
        },
        "outside the autoscaling bounds": {
            "shards": [
                {"name": "a", "default": True, "replicas": 5, "autoscaling": {"min_replicas": 1, "max_replicas": 2}}
            ]
        },
        "a mapping of min_replicas": {"shards": [{"name": "a", "default": True, "autoscaling": {"max_replicas": 2}}]},
    }
    for words, data in bad.items():
        with pytest.raises(InvalidSetting, match=words):
            parse(data)
    (tmp_path / "broken.yaml").write_text("shards: [unclosed")
    with pytest.raises(InvalidSetting, match="not YAML"):
        load(tmp_path / "broken.yaml")
    experts = {
        1: ExpertProfile(1, "git", "", "", 5, None, (0, 2)),
        2: ExpertProfile(2, "sqlite", "", "", 5, None, (1,)),
    }
    lists = parse({"shards": [{"name": "g", "experts": ["git"]}, {"name": "r", "default": True}]}).lists_of_shards(
        experts, 4
    )
    assert [ls.tolist() for ls in lists] == [[0, 2], [1, 3]]  # sqlite is not named: the default shard
    with pytest.raises(InvalidSetting, match="does not have"):
        example.lists_of_shards(experts, 4)


def test_ray_up_checks_the_map_against_the_store_before_it_starts_anything(
    client: TestClient, routed: dict[str, Any], tmp_path: Any
) -> None:
    """A map naming experts the store does not have: `moerag ray up` says which it has, before
    Ray or Serve is started (Serve would only report that a deployment failed)."""
    pytest.importorskip("ray")
    import json

    from app.cli.main import main

    rt = client.app.state.runtime  # type: ignore[attr-defined]
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps({"shards": [{"name": "x", "experts": ["nosuch", "git"], "default": True}]}))
    with pytest.raises(SystemExit) as exc:
        main(["--data-dir", str(rt.settings.resolved_data_dir), "ray", "up", "--config", str(bad)])
    message = str(exc.value)
    assert "invalid_setting" in message and "does not have: ['nosuch']; it has: [" in message and "'git'" in message


def test_an_unquoted_expert_name_in_yaml_says_to_quote_it(tmp_path: Any) -> None:
    """`experts: [Python: module json]` is YAML for a mapping: the error says to quote the name."""
    from app.shards.map import load
    from engine.errors import InvalidSetting

    bad = tmp_path / "shards.yaml"
    bad.write_text("shards:\n  - name: a\n    default: true\n    experts: [Python: module json, git]\n")
    with pytest.raises(InvalidSetting, match="quote names in YAML"):
        load(bad)
    good = tmp_path / "quoted.yaml"
    good.write_text('shards:\n  - name: a\n    default: true\n    experts: ["Python: module json", git]\n')
    assert load(good).shards[0].experts == ("Python: module json", "git")


def test_shard_replicas_built_from_sql_follow_the_index_log_for_their_lists(
    client: TestClient, routed: dict[str, Any]
) -> None:
    """`ShardReplica` (what a Ray Serve shard replica runs): built from SQL with only its lists,
    it follows ingestion and deletion through the index log, and a list moving to another
    shard's expert; the shards together always equal the replica."""
    from sqlalchemy import select

    from app.core.models import Chunk
    from app.services import experts as expert_service
    from app.services.documents import Upload
    from app.shards.map import parse
    from app.shards.parts import part_prefix
    from app.shards.replicas import ShardReplica
    from tests.helpers import topic_doc

    rt = client.app.state.runtime  # type: ignore[attr-defined]
    shard_map = parse(
        {"shards": [{"name": "code", "experts": ["git"]}, {"name": "rest", "experts": ["debian"], "default": True}]}
    )
    state = rt.state()
    lists = shard_map.lists_of_shards(state.experts, state.index.nlist)
    replicas = [ShardReplica(rt.settings.db_url, shard_map, n, rt.embedder.dim, poll_seconds=0) for n in range(2)]
    assert [r.lists.tolist() for r in replicas] == [ls.tolist() for ls in lists]
    try:
        added = [
            rt.ingestor.ingest(Upload(topic_doc(t, 900 + i, 2).encode(), f"late-{t}-{i}.md"))
            for i, t in enumerate(["git", "sqlite", "debian"])
        ]
        rt.ingestor.delete(added[2].document_id)
        # Asked at the state's position, a replica behind it follows first (read your writes).
        q = rt.embedder.encode([topic_doc("git", 900, 2)])  # [1, D] the new git document itself
        before = replicas[0].position
        _, ids, lo, hi = replicas[0].search(q, 5, replicas[0].lists, at_least=rt.state().index_position)
        assert lo == hi == replicas[0].position  # the version the searched content is at
        assert replicas[0].position == rt.catalogue.version > before
        with rt.sessions() as s:
            new_chunks = set(s.scalars(select(Chunk.id).where(Chunk.document_id == added[0].document_id)))
        assert new_chunks & set(ids[0].tolist())
        for r in replicas:
            assert r.follow() == rt.catalogue.version
        index = rt.state().index
        assert sum(r.index.ntotal for r in replicas) == index.ntotal
        sharded = ShardedIndex(index, lists, [local_search(r.index) for r in replicas])
        q = rt.embedder.encode(["git rebase onto a branch", "sqlite write-ahead log", "apt dependencies"])
        for scope in (None, list(state.experts[routed["experts"]["git"]].clusters)):
            assert np.array_equal(sharded.search(q, 10, scope)[1], index.search(q, 10, scope)[1])
        stats = [r.stats() for r in replicas]
        assert all(s["position"] == rt.catalogue.version for s in stats)
        # Several searches at once (what Serve batches on a replica): each exactly its own search.
        git_lists = replicas[0].lists
        asks = [(q[:1], 10, git_lists), (q[1:], 5, git_lists[:2]), (q[:2], 10, git_lists[1:])]
        many = replicas[0].search_many([a[0] for a in asks], [a[1] for a in asks], [a[2] for a in asks], [0, 0, 0])
        for (qi, k, ls), (scores, ids, *_) in zip(asks, many, strict=True):
            one = index.search(qi, k, ls)  # the whole replica, asked each search alone
            assert np.array_equal(ids, one[1]) and np.allclose(scores, one[0])
        # Each row over its own lists, only ids up to a bound (a fit's probe): as the whole replica.
        row_lists = [git_lists[:3], git_lists[2:5], np.zeros(0, dtype=np.int64)]
        through = int(np.median(index.assignments()[0]))
        scores, ids, *_ = replicas[0].rows(q, 5, row_lists, through, at_least=rt.catalogue.version)
        want_scores, want_ids = index.search_rows(q, 5, row_lists, through)
        assert np.array_equal(ids, want_ids) and np.allclose(scores[:2], want_scores[:2]) and (ids[2] == -1).all()
        assert ids.max() <= through and (ids[:2] >= 0).any()
        # An expert's list moves to an expert of the other shard: both shards read their lists again.
        moving = int(lists[0][0])
        expert_service.assign(rt.sessions, [moving], routed["experts"]["debian"])
        # Asked at the catalogue version of the move (the mapping moved, not the index log), the
        # new owner reads its lists again before it answers: the moved list's vectors are there.
        at = rt.catalogue.version
        assert at > rt.state().index_position  # a mapping change moves no index position
        found = replicas[1].search(q, 10, np.array([moving]), at_least=at)[1]
        assert np.array_equal(found, index.search(q, 10, [moving])[1]) and (found >= 0).any()
        # BM25: the new owner holds the moved chunks' postings before its next full read, and their
        # scores are the whole store's (the old owner keeps them until its own read: one is enough).
        with rt.sessions() as s:
            moved_ids = np.array(s.scalars(select(Chunk.id).where(Chunk.cluster_id == moving)).all())
        from app.serving.lexical import build

        whole, _ = build(rt.sessions)  # BM25 over every chunk now (the served one is rebuilt spaced)
        w = whole.stats.weights("git branch commit rebase")
        assert replicas[1].bm25.stale and w is not None and len(moved_ids)
        got = replicas[1].lexical(w, 0, None, moved_ids, at).of_ids
        want = whole.query("git branch commit rebase").scores_of(moved_ids.tolist())
        assert np.array_equal(got, want) and got.any()
        # A search carrying the question's weights brings its chunks' scores (the fusion's, no call of its own).
        answer = replicas[1].search(q[:1], 10, replicas[1].lists, at, w)
        assert len(answer) == 7 and (answer[1] >= 0).all()
        bm25_of = whole.query("git branch commit rebase").scores_of(answer[1][0].tolist())
        assert np.array_equal(answer[4][0], bm25_of)
        # ... and its best per list, every list it holds (the fusion's scale for any scope there)
        lists, best = answer[5], answer[6]
        for c in lists.tolist()[:5]:
            mask = np.isin(whole.ids, rt.state().index.assignments()[0][rt.state().index.assignments()[1] == c])
            assert best[lists.tolist().index(c)] == whole.query("git branch commit rebase").best(mask)
        assert replicas[1].bm25.refresh(replicas[1].lists) and not replicas[1].bm25.stale
        assert np.array_equal(replicas[1].lexical(w, 0, None, moved_ids).of_ids, want)
        for r in replicas:
            r.follow()
        assert moving not in replicas[0].lists and moving in replicas[1].lists
        assert sum(r.index.ntotal for r in replicas) == rt.state().index.ntotal
        assert replicas[1].index.list_sizes()[moving] == rt.state().index.list_sizes()[moving]
        # A replica boots from the newest snapshot (its lists cut from it, the log replayed after
        # it) when there is one to trust, else from SQL; either way it holds what SQL holds.
        rt.indexes.checkpoint()
        where = str(rt.settings.index_dir)
        late = rt.ingestor.ingest(Upload(topic_doc("debian", 950, 2).encode(), "after-the-snapshot.md"))
        assert late.status == "created"
        booted = [ShardReplica(rt.settings.db_url, shard_map, n, rt.embedder.dim, 0, where) for n in range(2)]
        replicas += booted
        assert all(r.booted.startswith("snapshot@") for r in booted), [r.booted for r in booted]
        for fresh, old in zip(booted, replicas[:2], strict=True):
            old.follow()
            assert fresh.position == old.position == rt.catalogue.version
            assert fresh.lists.tolist() == old.lists.tolist()
            assert np.array_equal(fresh.index.list_sizes(), old.index.list_sizes())
            assert np.array_equal(fresh.search(q, 10, fresh.lists)[1], old.search(q, 10, old.lists)[1])
        # A replica writes its own part; the next one of that shard boots from it (bytes of its
        # lists only), and a part is written again only once the shard moved on.
        # Parts of lists no shard holds now (a mapping changed) or of another clustering are removed.
        folder, clustering = rt.settings.index_dir, booted[0].clustering
        stale = [folder / f"shard-{clustering}-000000000000@1.faiss", folder / "shard-old-000000000000@1.faiss"]
        for f in stale:
            f.write_bytes(b"stale")
        assert booted[1].write_part() and booted[0].write_part() and not booted[0].write_part()
        ours = {r.shard: part_prefix(clustering, r.lists) for r in booted}
        assert sorted(f.name for f in folder.glob("shard-*.faiss")) == sorted(
            f"{ours[r.shard]}{r.position}.faiss" for r in booted
        )
        part = ShardReplica(rt.settings.db_url, shard_map, 0, rt.embedder.dim, 0, where)
        replicas.append(part)
        assert part.booted == f"part@{booted[0].position}" and part.lists.tolist() == booted[0].lists.tolist()
        assert np.array_equal(part.index.list_sizes(), booted[0].index.list_sizes())
        written = folder / f"{ours[0]}{part.position}.faiss"
        assert written.stat().st_size < max(f.stat().st_size for f in folder.glob("ivf-*.faiss"))
        rt.ingestor.ingest(Upload(topic_doc("git", 960, 2).encode(), "after-the-part.md"))
        booted[0].follow()
        assert booted[0].write_part() and not written.exists()  # the older part removed
        assert (folder / f"{ours[0]}{booted[0].position}.faiss").exists()
        for snapshot in rt.settings.index_dir.glob("*.faiss"):
            snapshot.write_bytes(b"not an index")  # unreadable: SQL builds the replica
        replicas.append(ShardReplica(rt.settings.db_url, shard_map, 1, rt.embedder.dim, 0, where))
        booted[1].follow()
        assert replicas[-1].booted == "sql" and replicas[-1].index.ntotal == booted[1].index.ntotal
    finally:
        for r in replicas:
            r.close()


def test_a_shard_that_does_not_answer_makes_the_answer_partial_never_an_error(
    client: TestClient, routed: dict[str, Any]
) -> None:
    """One shard's search raises (a replica gone, a timeout): /ask answers from the others with
    `partial: true` and the shard named; the next state without the fault answers whole."""
    rt = client.app.state.runtime  # type: ignore[attr-defined]
    experts = routed["experts"]
    down = {"on": True}

    def failing(part: ClusteredIndex) -> Any:
        search = local_search(part)

        def maybe(q: Any, k: int, lists: Any, at_least: int | None = None, bm25: Any = None) -> Any:
            if down["on"]:
                raise TimeoutError("shard sqlite did not answer in 5 s")
            return search(q, k, lists, at_least)

        return maybe

    class InProcess:  # a ShardTier (app.serving.states) whose shards live here
        def __init__(self) -> None:
            self.positions: list[int] = []  # the catalogue version each state's shards are asked at

        def index_over(self, index: ClusteredIndex, profiles: Any, position: int) -> ShardedIndex:
            self.positions.append(position)
            owners: list[int | None] = [None] * index.nlist
            for eid, p in profiles.items():
                for c in p.clusters:
                    owners[c] = eid
            shard = shard_of_lists(owners, {experts["git"]: 0, experts["sqlite"]: 1}, default=2)
            lists = [np.flatnonzero(shard == s) for s in range(3)]
            parts = [carve(index, ls) for ls in lists]
            searches = [local_search(parts[0]), failing(parts[1]), local_search(parts[2])]
            self.parts = parts
            return ShardedIndex(index, lists, searches, shard_map="test", names=["git", "sqlite", "rest"])

        def lexical_over(self, stats: Any, index: ShardedIndex, position: int, summary: bool) -> ShardedLexical:
            """BM25's postings on the same parts, the sqlite shard's failing alike."""
            records = rt.pipeline.store.fetch(index.assignments()[0].tolist())
            calls = []
            for n, part in enumerate(self.parts):
                ids = [i for i in part.assignments()[0].tolist() if i in records]
                ask = local_lexical(Postings(ids, [f"{records[i].heading}\n{records[i].text}" for i in ids]), part)
                calls.append(ask if n != 1 else lambda *a, ask=ask: ask(*a) if not down["on"] else _timeout())
            return ShardedLexical(stats, calls, ["git", "sqlite", "rest"], index, summary=summary)

        def overview(self) -> list[dict[str, Any]]:
            names = ["git", "sqlite", "rest"]
            return [{"shard": n, "vectors": p.ntotal, "position": 0} for n, p in zip(names, self.parts, strict=True)]

    states = rt.services.states
    assert client.get("/admin/api/shards", headers=AUTH).json() == {"shard_map": None, "shards": []}
    assert client.get("/stats", headers=AUTH).json()["shards"] is None
    tier = InProcess()
    states.shards = tier
    states.changed(rt.catalogue.version, frozenset({"index"}))
    counted = client.get("/stats", headers=AUTH).json()  # each shard's vectors (null without shards)
    assert [r["shard"] for r in counted["shards"]] == ["git", "sqlite", "rest"]
    assert sum(r["vectors"] for r in counted["shards"]) == counted["chunks"]
    # A mapping change (no index change) publishes a state whose shards are asked at its catalogue
    # version: a shard that a list just moved to reads it before it answers (app.shards.replicas).
    moved = client.post(
        "/admin/api/clusters/assign", json={"cluster_ids": [0], "expert_id": experts["git"]}, headers=AUTH
    )
    assert moved.status_code == 200, moved.text
    assert tier.positions[-1] == rt.state().version > rt.state().index_position
    r = client.post("/ask", json={"query": "SQLite write-ahead log checkpoint", "mode": "fallback"})
    assert r.status_code == 200
    body = r.json()
    assert body["route"]["partial"] is True and body["route"]["missing_shards"] == ["sqlite"]
    assert body["citations"] and all(not c["source"].startswith("sqlite") for c in body["citations"])
    down["on"] = False
    whole = client.post("/ask", json={"query": "SQLite write-ahead log checkpoint", "mode": "fallback"}).json()
    assert whole["route"]["partial"] is False and whole["route"]["missing_shards"] == []
    assert any(c["source"].startswith("sqlite") for c in whole["citations"])


def _timeout() -> Any:
    raise TimeoutError("shard sqlite did not answer in 5 s")


def test_a_remote_embedder_sends_a_batch_in_calls_the_replica_can_take_and_says_when_none_answers(
    embedder: Any,
) -> None:
    """`RemoteEmbedder` (app.shards.embedder) over a stand-in handle: questions go in calls of at most
    the replica's `max_batch`, all sent before any is awaited, back in order; token counts come
    from the tokenizer here; a deployment that does not answer is a clear NotConfigured."""
    pytest.importorskip("ray")
    from app.shards.embedder import RemoteEmbedder
    from engine.errors import NotConfigured

    class Call:
        def __init__(self, fn: Any) -> None:
            self.fn = fn

        def remote(self, *args: Any) -> Any:
            return type("Response", (), {"result": lambda _self, timeout_s=None: self.fn(*args)})()

    sent: list[int] = []

    def questions(texts: list[str]) -> Any:
        sent.append(len(texts))
        return embedder.encode_questions(texts)

    info = {
        "dim": embedder.dim,
        "name": embedder.name,
        "max_tokens": embedder.max_tokens,
        "max_batch": 4,
        "dtype": embedder.dtype_name,
        "question_model": "eager",
    }
    handle = type(
        "Handle", (), {"info": Call(lambda: info), "questions": Call(questions), "documents": Call(embedder.encode)}
    )()
    remote = RemoteEmbedder(handle)
    texts = [f"how do I use feature {n}?" for n in range(10)]
    # batches of 4 are padded otherwise than one of 10: bfloat16 (a CPU with bf16 units) moves ~1e-3
    atol = 1e-6 if embedder.dtype_name == "float32" else 1e-2
    assert np.allclose(remote.encode_questions(texts), embedder.encode_questions(texts), atol=atol) and sent == [
        4,
        4,
        2,
    ]
    assert remote.count_tokens(texts) == embedder.count_tokens(texts)
    assert remote.encode([]).shape == (0, embedder.dim) and remote.encode(texts[:2]).shape == (2, embedder.dim)

    def down() -> Any:
        raise TimeoutError("no replica")

    with pytest.raises(NotConfigured, match="ray up"):
        RemoteEmbedder(type("Handle", (), {"info": Call(down)})())


def test_an_ingress_on_ray_is_one_server_of_several_workers(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its replicas get the database, the shared data dir, the map and the token (and this
    process's MOERAG_* settings); SQLite, which serves from one process, is refused with the fix."""
    from app.core.settings import Settings
    from app.shards.ingress import ingress_env
    from engine.errors import NotConfigured

    monkeypatch.setenv("MOERAG_ROUTE_THRESHOLD", "0.8")
    with pytest.raises(NotConfigured, match="MOERAG_DATABASE_URL=postgresql"):
        ingress_env(Settings(data_dir=tmp_path), tmp_path / "shards.yaml", "t")
    url = "postgresql+psycopg://u:p@127.0.0.1/db"
    env = ingress_env(Settings(data_dir=tmp_path, database_url=url), tmp_path / "shards.yaml", "t")
    assert env["MOERAG_DATABASE_URL"] == url and env["MOERAG_ADMIN_TOKEN"] == "t"
    assert env["MOERAG_SHARD_MAP"] == str(tmp_path / "shards.yaml") and env["MOERAG_ROUTE_THRESHOLD"] == "0.8"
    assert env["MOERAG_DATA_DIR"] == str(tmp_path) and int(env["MOERAG_WORKER_OF"]) > 0


def test_a_server_over_shards_keeps_the_lists_without_the_vectors(client: TestClient, routed: dict[str, Any]) -> None:
    """`IndexManager(vectors=False)` (a server with MOERAG_SHARD_MAP): a ListMap built from SQL's
    assignments, equal to the vector replica's; it follows an upload and a deletion through the
    index log; a new document is placed and fitted as the vector replica places and fits it (the
    fit's nearest chunks searched on the shards); a checkpoint writes no snapshot."""
    from app.clustering.indexing import IndexManager
    from app.services.documents import Upload
    from tests.helpers import topic_doc

    rt = client.app.state.runtime  # type: ignore[attr-defined]
    lean = IndexManager(rt.settings, rt.sessions, rt.embedder.dim, rt.embedder.name, vectors=False)
    assert lean.open() == "lists only" and isinstance(lean.index, ListMap)
    whole = rt.indexes.index

    def same() -> None:
        assert lean.index.version == whole.version and lean.index.nlist == whole.nlist
        for got, want in zip(lean.index.assignments(), whole.assignments(), strict=True):
            assert np.array_equal(got, want)

    same()
    added = rt.ingestor.ingest(Upload(topic_doc("sqlite", 950, 3).encode(), "lean-sqlite.md"))
    lean.follow(rt.catalogue.version)
    same()
    rt.ingestor.delete(added.document_id)
    lean.follow(rt.catalogue.version)
    same()
    assert lean.position == rt.catalogue.version

    experts = routed["experts"]
    owners: list[int | None] = [None] * whole.nlist
    for eid, profile in rt.state().experts.items():
        for c in profile.clusters:
            owners[c] = eid
    shard = shard_of_lists(owners, {experts["git"]: 0, experts["sqlite"]: 1}, default=2)
    lists = [np.flatnonzero(shard == s) for s in range(3)]
    parts = [carve(whole, ls) for ls in lists]
    over_shards = ShardedIndex(lean.index, lists, [local_search(p) for p in parts], rows=[local_rows(p) for p in parts])
    vectors = rt.embedder.encode([topic_doc("git", 951, 1), topic_doc("debian", 952, 1)])
    got = lean.place_document(vectors, "lean-new.md", search=over_shards)
    want = rt.indexes.place_document(vectors, "lean-new.md")
    assert np.array_equal(got.lists, want.lists) and got.fits == pytest.approx(want.fits)
    assert want.document_fit is not None and got.document_fit == pytest.approx(want.document_fit)

    def down(*args: Any) -> Any:
        raise TimeoutError("shard sqlite did not answer in 5 s")

    one_down = ShardedIndex(
        lean.index, lists, [local_search(p) for p in parts], rows=[local_rows(parts[0]), down, local_rows(parts[2])]
    )
    unknown = lean.place_document(vectors, "lean-new.md", search=one_down)  # a shard down: the fit is unknown
    assert unknown.document_fit is None and np.array_equal(unknown.lists, want.lists)
    written = lean.snapshots(whole.version)
    lean.checkpoint()  # nothing to write; the log it followed may be compacted (after the retention)
    assert lean.snapshots(whole.version) == written and lean.written == lean.position


def test_a_cluster_of_several_nodes_refuses_a_store_only_this_machine_reads() -> None:
    """`ray up` on more than one node: SQLite and a local snapshot folder are refused, with the fix."""
    from app.shards.replicas import refuse_local_store
    from engine.errors import NotConfigured

    refuse_local_store(1, "sqlite:////data/moerag.db", "/data/index")  # one machine: all of it is local
    with pytest.raises(NotConfigured, match="2 nodes") as refused:
        refuse_local_store(2, "sqlite:////data/moerag.db", "/data/index")
    assert "MOERAG_DATABASE_URL to PostgreSQL" in str(refused.value)
    assert "MOERAG_SNAPSHOT_URL" in str(refused.value)
    with pytest.raises(NotConfigured, match="MOERAG_SNAPSHOT_URL") as refused:
        refuse_local_store(3, "postgresql+psycopg://db/moerag", "/data/index")
    assert "SQLite" not in str(refused.value)
    refuse_local_store(3, "postgresql+psycopg://db/moerag", "s3://bucket/moerag")  # shared: accepted
    refuse_local_store(3, "postgresql+psycopg://db/moerag", "file:///mnt/shared/moerag")
