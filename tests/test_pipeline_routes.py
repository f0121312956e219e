"""The routing rule of AskPipeline with a real Router whose weights are set by hand."""

import numpy as np
import pytest
import torch

from engine.pipeline import AskPipeline, AskRequest, ExpertProfile
from engine.router import GateNet, Router
from engine.serving import fixed_state


def router_with_logits(logits: list[float], expert_ids: list[int]) -> Router:
    """A gate that outputs the given logits for any unit input (bias only)."""
    net = GateNet(4, len(logits), hidden=2)
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        net.net[3].bias.copy_(torch.tensor(logits))
    return Router(net, 1.0, expert_ids, version_id=7)


class _Embed:
    dim = 4

    def encode(self, texts: list[str]) -> np.ndarray:
        return np.ones((len(texts), 4), dtype=np.float32) / 2


def pipeline(router: Router | None, experts: dict[int, ExpertProfile]) -> AskPipeline:
    return AskPipeline(
        embedder=_Embed(),  # type: ignore[arg-type]
        state=lambda: fixed_state(None, experts, router),  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]
        generator=lambda name: None,  # type: ignore[arg-type,return-value]
    )


EXPERTS = {
    1: ExpertProfile(1, "git", "", "extractive", 5, None, (0, 1)),
    2: ExpertProfile(2, "sqlite", "", "extractive", 5, 0.95, (2,)),
    3: ExpertProfile(3, "empty", "", "extractive", 5, None, ()),
}


@pytest.mark.parametrize(
    ("logits", "path", "reason", "expert"),
    [
        ([4.0, 0.0, 0.0, 0.0], "expert", "confident", 1),  # p(git) ~ 0.95 >= 0.7
        ([1.0, 0.8, 0.0, 0.0], "fallback", "low_confidence", None),  # p(git) ~ 0.42
        ([0.0, 0.0, 0.0, 5.0], "fallback", "none_class", None),  # "none" wins
        ([0.0, 3.0, 0.0, 0.0], "fallback", "low_confidence", None),  # p ~ 0.87 < sqlite's own 0.95
        ([0.0, 0.0, 5.0, 0.0], "fallback", "expert_has_no_clusters", None),
    ],
)
def test_route_rule(logits: list[float], path: str, reason: str, expert: int | None) -> None:
    p = pipeline(router_with_logits(logits, [1, 2, 3]), EXPERTS)
    route = p._route(np.ones((1, 4), dtype=np.float32), AskRequest("q"))
    assert (route.path, route.reason) == (path, reason), route.detail
    assert (route.expert.id if route.expert and route.path == "expert" else None) == expert
    assert route.router_version == 7 and len(route.top) == 3
    probs = torch.softmax(torch.tensor(logits), 0).sort(descending=True).values[:3]
    assert np.allclose([t[1] for t in route.top], probs.numpy(), atol=1e-6)


def test_forced_and_missing_router() -> None:
    p = pipeline(None, EXPERTS)
    q = np.ones((1, 4), dtype=np.float32)
    assert p._route(q, AskRequest("q")).reason == "no_router"
    assert p._route(q, AskRequest("q", mode="fallback")).reason == "forced"
    r = p._route(q, AskRequest("q", mode="expert", expert_id=2))
    assert (r.path, r.reason, r.expert.id if r.expert else None) == ("expert", "forced", 2)
    assert p._route(q, AskRequest("q", mode="expert", expert_id=3)).reason == "expert_has_no_clusters"
    assert p._route(q, AskRequest("q", mode="expert")).reason == "unknown_expert"  # no router to pick one


def test_a_route_beaten_by_a_chunk_outside_its_expert_is_checked() -> None:
    from engine.lexical import LexicalIndex
    from engine.pipeline import Route
    from engine.route_check import best_outside
    from index import ClusteredIndex

    dim = 16
    index = ClusteredIndex.create(np.eye(dim, dtype=np.float32), "v")  # 16 lists, one per axis
    inside = np.eye(dim, dtype=np.float32)[[0]]  # list 0's chunk
    outside = np.eye(dim, dtype=np.float32)[[5]]  # list 5's chunk, nearer the question
    index.add(np.concatenate([inside, outside]), np.array([1, 2]), np.array([0, 5]))
    q = np.eye(dim, dtype=np.float32)[[5]] * 0.9 + np.eye(dim, dtype=np.float32)[[0]] * np.sqrt(1 - 0.81)
    p = pipeline(None, EXPERTS)
    p.config.expert_verify_lists = 4
    route = Route("expert", "confident", "", EXPERTS[1], 0.9, [], 0.7, 7)
    best = float(q[0] @ inside[0])
    found = best_outside(q, index, [0], 4)
    assert found is not None and found.score == pytest.approx(float(q[0] @ outside[0]))
    assert index.scan_size(found.probed) == (2, 1)  # 16 // 8 lists probed, one vector there
    reason, detail = p._check_route(q, None, index, [0], best, route) or ("", "")
    assert reason == "nearer_outside_expert" and "0.900 > 0.436" in detail
    assert route.clusters_scanned == 2 and route.vectors_scanned == 1  # the check's probe, counted on the route
    # A route whose best chunk is inside its expert stands.
    assert p._check_route(q, None, index, [0, 5], best, route) is None
    # An outside chunk a little *worse* than the best inside: the route stands, unless BM25's
    # best chunk over the whole store lies outside too (the lexical witness).
    near_best = float(q[0] @ outside[0]) + 0.03
    lexical = LexicalIndex([1, 2], ["the stable release", "sid is the unstable release"])
    assert p._check_route(q, None, index, [0], near_best, route) is None  # no BM25 index
    reason, _ = p._check_route(q, lexical.query("sid release"), index, [0], near_best, route) or ("", "")
    assert reason == "lexical_outside_expert"
    assert p._check_route(q, lexical.query("stable"), index, [0], near_best, route) is None  # BM25's best inside
    assert p._check_route(q, lexical.query("sid release"), index, [0], near_best + 0.1, route) is None  # beyond
    p.config.expert_verify_lexical_slack = 0
    assert p._check_route(q, lexical.query("sid release"), index, [0], near_best, route) is None  # witness off
    p.config.expert_verify_lists = 0
    assert p._check_route(q, None, index, [0], best, route) is None  # the whole check off


def test_the_gates_vote_probes_the_index_and_can_settle_a_route() -> None:
    """An unsure gate (git ~ sqlite) becomes sure when the question's nearest chunks all lie in git's lists."""
    from index import ClusteredIndex

    router = router_with_logits([0.0, 0.0, 0.0, -9.0], [1, 2, 3])
    centroids = np.eye(4, dtype=np.float32)  # 4 lists, one per axis
    router.net.set_lists(centroids, np.array([0, 0, 1, 3], dtype=np.int64))  # lists 0, 1: git; 2: sqlite
    index = ClusteredIndex.create(centroids, "v")
    near = np.full((3, 4), 0.5, dtype=np.float32)  # the question itself, three times
    far = np.eye(4, dtype=np.float32)[[2, 2]]
    index.add(np.concatenate([near, far]), np.arange(5), np.array([0, 0, 1, 2, 2]))
    p = pipeline(router, EXPERTS)
    p.state = lambda: fixed_state(index, EXPERTS, router)
    q = np.full((1, 4), 0.5, dtype=np.float32)
    assert p._route(q, AskRequest("q")).reason == "low_confidence"  # vote weight 0: no probe
    router.net.vote_params.copy_(torch.tensor([3.0, 4.0, 3.0, 20.0, 0.01]))  # probe 4 lists, 3 chunks vote
    route = p._route(q, AskRequest("q"))
    assert (route.path, route.reason, route.expert.id if route.expert else None) == ("expert", "confident", 1)
    assert route.clusters_scanned == 4 and route.vectors_scanned == 5  # the probe is counted as work
    assert p._route(q, AskRequest("q", mode="fallback")).vectors_scanned == 0  # no gate, no probe
    # BM25's best chunks (ids 3 and 4, in sqlite's list) take half of the vote: git is no longer sure.
    from engine.lexical import LexicalIndex

    bm25 = LexicalIndex(range(5), ["git", "git", "git", "postbuffer sqlite", "postbuffer"])
    router.net.lexical_params.copy_(torch.tensor([1.0, 2.0, 5.0]))
    assert router.lexical_chunks == 2
    pooled = p._route(q, AskRequest("q"), bm25.query("what is postbuffer"))
    assert (pooled.path, pooled.reason) == ("fallback", "low_confidence") and pooled.top[1][0] == EXPERTS[2]
    no_terms = p._route(q, AskRequest("q"), bm25.query("zzz"))  # no hits: the dense vote alone
    assert (no_terms.path, no_terms.confidence) == ("expert", pytest.approx(route.confidence))


def test_fusion_rescores_the_dense_candidates_on_the_scopes_bm25_scale() -> None:
    """Convex fusion: cosine + weight x BM25 / the best BM25 *in the searched scope*; RRF by ranks."""
    from functools import partial

    from engine.lexical import LexicalIndex
    from engine.pipeline import ChunkRecord
    from index import ClusteredIndex

    class Store:
        def fetch(self, ids: list[int]) -> dict[int, ChunkRecord]:
            return {i: ChunkRecord(i, i, f"{i}.md", "", "", "", 0) for i in ids}

    index = ClusteredIndex.create(np.eye(4, dtype=np.float32), "v")
    index.add(np.eye(4, dtype=np.float32), np.array([1, 2, 3, 4]), np.array([0, 0, 1, 2]))  # 4 outside the scope
    bm25 = LexicalIndex([1, 2, 3, 4], ["apt pinning", "apt sources", "apt pinning priority", "pinning priority"])
    p = pipeline(None, EXPERTS)
    p.store = Store()
    dense = [(1, 0.80), (2, 0.70), (3, 0.69)]
    raw = bm25.query("pinning priority")
    assert raw.scores is not None and raw.scores[3] > raw.scores[2]  # the best BM25 chunk lies outside
    terms = bm25.terms("pinning priority", partial(p._scope_mask, bm25, index))
    p.config.lexical_weight = 0.05
    fused = p._fuse(dense, terms, 3, 3, index, [0, 1])
    # chunk 3 holds the scope's best BM25 score: +0.05 lifts it past 2 (0.74), not past the clear winner 1
    assert [c.chunk.id for c in fused] == [1, 3, 2] and fused[1].score == pytest.approx(0.74)
    assert fused[0].score > 0.80  # chunk 1 shares "pinning": a part of the weight
    assert [c.chunk.id for c in p._fuse(dense, None, 2, 3, index, [0, 1])] == [1, 2]  # no BM25: dense order
    p.config.fusion, p.config.lexical_weight = "rrf", 0.1
    fused = p._fuse(dense, terms, 3, 3, index, [0, 1])
    assert [c.chunk.id for c in fused] == [1, 3, 2] and fused[0].score == pytest.approx(1 / 61 + 0.1 / 62)


def test_the_balance_gauges_read_the_recent_window() -> None:
    from prometheus_client import generate_latest

    from app.core.metrics import Metrics
    from engine.pipeline import Route

    def route(name: str | None, entropy: float) -> Route:
        expert = ExpertProfile(1, name, "", "", 5, None, (0,)) if name else None
        path = "expert" if name else "fallback"
        return Route(path, "confident", "", expert, 0.9, [], 0.7, 1, entropy=entropy)

    m = Metrics(window=4)
    for r in [route("a", 9.0), route("a", 0.2), route("a", 0.4), route("b", 0.6), route(None, 0.8)]:
        m.observe(r, {"embed": 1.0})  # the first falls out of the window of 4
    text = generate_latest(m.registry).decode()
    # hits a: 2, b: 1 -> mean 1.5, std 0.5; entropy (0.2 + 0.4 + 0.6 + 0.8) / 4
    assert "moerag_expert_load_imbalance 0.333333" in text
    assert "moerag_routing_entropy 0.5" in text
