import numpy as np
import pytest
import torch

from engine.calibration import coverage_at, expected_calibration_error, fit_temperature
from engine.router import Router
from engine.router_training import TrainConfig, TrainingSet, class_weights, train
from engine.samples import query_like_samples


def blobs(
    n_per: int, n_classes: int, dim: int = 16, spread: float = 0.6, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((n_classes, dim))
    x = np.concatenate([c + spread * rng.standard_normal((n_per, dim)) for c in centers]).astype(np.float32)
    y = np.repeat(np.arange(n_classes), n_per).astype(np.int64)
    return x / np.linalg.norm(x, axis=1, keepdims=True), y


def voted(share: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, TrainingSet]:
    """Three overlapping classes (the MLP alone is unsure) and a probe whose 5 neighbours sit in the
    true class's list with probability `share`: (x, calib, scores, lists, training set)."""
    x, y = blobs(150, 3, spread=1.5)
    calib = np.random.default_rng(1).random(len(y)) < 0.4
    held = int(calib.sum())
    truth = y[calib][:, None]  # [H, 1]
    lists = np.where(np.random.default_rng(2).random((held, 5)) < share, truth, (truth + 1) % 3)  # [H, 5]
    scores = np.full((held, 5), 0.8, dtype=np.float32)
    data = TrainingSet(x, y, calib, 3, x[:3].copy(), np.arange(3, dtype=np.int64), (scores, lists), (2, 5))
    return x, calib, scores, lists, data


def test_temperature_scaling_lowers_ece_on_held_out_data() -> None:
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 4, (4000,), generator=g)
    clean = torch.nn.functional.one_hot(labels, 4).float() * 2.0 + torch.randn(4000, 4, generator=g)
    logits = clean * 4.0  # an over-confident model: right often, far too sure
    fit, held = slice(0, 2000), slice(2000, 4000)
    t = fit_temperature(logits[fit], labels[fit])
    assert t > 1.5
    before = expected_calibration_error(torch.softmax(logits[held], -1), labels[held])
    after = expected_calibration_error(torch.softmax(logits[held] / t, -1), labels[held])
    assert after < before / 3 and after < 0.03


def test_ece_and_coverage_hand_computed() -> None:
    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.6, 0.4], [0.3, 0.7]])
    labels = torch.tensor([0, 1, 0, 1])
    # Bins: 0.9 (right), 0.8 (wrong), 0.6 (right), 0.7 (right) -> |.9-1|+|.8-0|+|.6-1|+|.7-1| over 4
    assert expected_calibration_error(probs, labels) == pytest.approx((0.1 + 0.8 + 0.4 + 0.3) / 4)
    assert coverage_at(probs, labels, 0.7) == (0.75, pytest.approx(2 / 3))


def test_class_weights_favour_rare_classes() -> None:
    w = class_weights(torch.tensor([0] * 90 + [1] * 10), 3)
    assert w[1] > w[0] and w[2] == 0


def test_training_learns_separable_experts_and_reports_metrics() -> None:
    x, y = blobs(150, 4)
    calib = np.random.default_rng(1).random(len(y)) < 0.3
    net, t, metrics = train(TrainingSet(x, y, calib, 4), TrainConfig(hidden=32, epochs=30))
    assert metrics["accuracy"] > 0.95
    assert {"ece_before", "ece_after", "coverage_at_threshold", "accuracy_at_threshold", "reliability"} <= set(metrics)
    assert len(metrics["reliability"]) == 15
    router = Router(net, t, expert_ids=[10, 20, 30])  # class 3 = none
    decisions = router.route(x[:5], k=3)
    for d in decisions:  # top-3 of 4 classes: descending, and at most the whole distribution
        assert len(d.classes) == 3 and d.probs == sorted(d.probs, reverse=True) and 0 < sum(d.probs) <= 1 + 1e-6
    assert router.expert_of(decisions[0].classes[0]) == 10
    restored = Router.from_state(router.state_bytes(), dim=16, hidden=32, expert_ids=[10, 20, 30], temperature=t)
    assert torch.allclose(restored.logits(x[:3]), router.logits(x[:3]))


def test_served_logits_equal_the_trained_torch_forward() -> None:
    """The router serves its MLP from frozen NumPy arrays (`FrozenMlp`); torch's forward is the twin."""
    from engine.router import FrozenMlp, GateNet

    x, calib, scores, lists, data = voted(share=0.6)
    net, t, metrics = train(data, TrainConfig(hidden=16, epochs=5))
    assert metrics["vote_weight"] > 0  # the retrieval-side terms are in the sum the twins compare
    router = Router(net, t, expert_ids=[10, 20])
    neighbours = (scores[:6], lists[:6])
    with torch.inference_mode():
        twin = net(torch.from_numpy(x[calib][:6]), net.votes(neighbours))  # [6, 3]
        mlp_only = net.net(torch.from_numpy(x[:6]))
    assert torch.allclose(router.logits(x[calib][:6], neighbours), twin, atol=1e-5)  # evidence and votes included
    assert np.allclose(router.mlp(x[:6]), mlp_only.numpy(), atol=1e-5)
    before = router.mlp.w1.copy()
    with torch.no_grad():
        net.net[0].weight.add_(1.0)  # training the module further cannot reach a served router's copy
    assert np.array_equal(router.mlp.w1, before)
    tanh_gelu = GateNet(16, 3, hidden=8)
    tanh_gelu.net[1] = torch.nn.GELU(approximate="tanh")
    deeper = GateNet(16, 3, hidden=8)
    deeper.net[2] = torch.nn.ReLU()  # a layer the copy would skip
    for unservable in (tanh_gelu.net, deeper.net):
        with pytest.raises(TypeError, match="exact GELU"):
            FrozenMlp.of(unservable)


def test_query_like_samples_come_from_chunks() -> None:
    texts = ["Short. " + "This sentence has enough words to be a sample here." * 1, "tiny"]
    samples = query_like_samples(texts, ["Guide > Install packages", ""], 200, seed=3)
    assert samples and all(s.source == 0 for s in samples)
    assert any("Install packages" in s.text for s in samples)


def test_weighted_reciprocal_rank_fusion() -> None:
    from engine.lexical import reciprocal_rank_fusion

    fused = reciprocal_rank_fusion([[1, 2, 3], [3, 4]], k=1)
    assert [d for d, _ in fused] == [3, 1, 2, 4]  # 3: 1/4 + 1/2 beats 1: 1/2
    fused = reciprocal_rank_fusion([[1, 2, 3], [3, 4]], k=1, weights=[1.0, 0.1])
    assert [d for d, _ in fused][:2] == [1, 2]


def test_convex_fusion_keeps_score_gaps() -> None:
    import numpy as np

    from engine.lexical import LexicalIndex, convex_fusion

    dense = [(1, 0.80), (2, 0.70), (3, 0.69)]
    fused = convex_fusion(dense, np.array([0.0, 0.0, 1.0]), weight=0.05)
    assert [d for d, _ in fused] == [1, 3, 2]  # 3 passes 2 (0.74 > 0.70) but not the clear winner 1
    assert fused[0][1] == 0.80 and abs(fused[1][1] - 0.74) < 1e-6
    lex = LexicalIndex([12, 10, 11], ["sqlite vacuum", "git rebase", "git merge"])  # ids in any order
    q = lex.query("git rebase")
    assert q.scores is not None
    expected = [float(q.scores[1]), float(q.scores[2]), 0.0, 0.0]
    assert q.scores_of([10, 11, 12, 99]).tolist() == expected  # 12 shares no term; 99 is not indexed
    assert expected[0] > expected[1] > 0
    assert q.best() == max(expected) and q.best(np.array([False, False, True])) == expected[1]  # row 2: id 11
    assert q.best(np.zeros(3, dtype=bool)) == 0.0 and lex.query("unrelated").best() == 0.0


def test_bm25_mask_restricts_the_search_to_a_scope() -> None:
    import numpy as np

    from engine.lexical import LexicalIndex

    lex = LexicalIndex(
        [10, 11, 12, 13], ["git rebase commits", "git merge commits", "sqlite vacuum", "git rebase onto"]
    )
    assert {i for i, _ in lex.search("git rebase", 4)} == {10, 11, 13}
    scope = np.array([False, True, True, False])  # only chunks 11 and 12
    assert [i for i, _ in lex.search("git rebase", 4, scope)] == [11]
    assert lex.search("git rebase", 4, np.zeros(4, dtype=bool)) == []


def test_a_lexical_query_scores_once_for_all_its_searches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The route's check (whole store) and the fusion (a scope) share one BM25 pass per question."""
    import numpy as np

    from engine.lexical import LexicalIndex

    lex = LexicalIndex(
        [10, 11, 12, 13], ["git rebase commits", "git merge commits", "sqlite vacuum", "git rebase onto"]
    )
    calls = []
    scores = lex.scores
    monkeypatch.setattr(lex, "scores", lambda text: calls.append(text) or scores(text))
    terms = lex.query("git rebase")
    scope = np.array([False, True, True, False])
    assert terms.search(1) == lex.search("git rebase", 1)[:1] and terms.search(4, scope) == lex.search(
        "git rebase", 4, scope
    )
    assert calls.count("git rebase") == 1 + 2  # the query once; each LexicalIndex.search alone once
    assert lex.query("the of").search(4) == []  # no terms: no scores, no hits


def test_bm25_search_ranks_as_bm25s_retrieve_does() -> None:
    """The lean selection (get_scores + top_k) finds bm25s's own top k, best first, ties by index."""
    import numpy as np

    from engine.lexical import LexicalIndex, tokenize, top_k

    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(40)]
    texts = [" ".join(rng.choice(words, 12)) for _ in range(300)]
    lex = LexicalIndex(list(range(1000, 1300)), texts)
    assert lex._bm25 is not None
    for query in ["w1 w2", "w3 w17 w30", "w5", "w39 w0 w22 w8"]:
        ours = lex.search(query, 20)
        docs, scores = lex._bm25.retrieve([tokenize(query)], k=20, show_progress=False)
        assert np.allclose([s for _, s in ours], [s for s in scores[0] if s > 0], atol=1e-6), query
        ranked = [1000 + int(d) for d, s in zip(docs[0], scores[0], strict=True) if s > 0]
        # A tie counts against every document, not only those kept: at the k-th place numpy's
        # argpartition (its SIMD paths differ by CPU) may keep either of two equal scores.
        every = lex._bm25.get_scores(tokenize(query))  # [N]
        untied = {i for i, s in ours if int(np.sum(np.abs(every - s) < 1e-9)) == 1}
        assert untied <= set(ranked), query
    assert top_k(np.array([1.0, 3.0, 3.0, 2.0, 3.0]), 3).tolist() == [1, 2, 4]  # ties by index
    assert top_k(np.array([3.0, 1.0, 3.0, 3.0, 0.5]), 2).tolist() == [0, 2]  # at the k-th place too
    assert top_k(np.array([1.0, 2.0]), 5).tolist() == [1, 0]
    assert top_k(np.array([]), 3).tolist() == []


def test_held_out_documents_are_whole_and_every_expert_keeps_training_documents() -> None:
    from engine.samples import held_out_documents

    # Documents 1-10 mostly of label 0, 11-13 of label 1, 20 alone of label 2; one chunk per row.
    documents = [d for d in range(1, 11) for _ in range(3)] + [11, 11, 12, 13] + [20, 20]
    labels = [0] * 30 + [1, 0, 1, 1] + [2, 2]
    held = held_out_documents(documents, labels, 0.3, seed=0)
    assert held == held_out_documents(documents, labels, 0.3, seed=0)  # deterministic
    assert len(held & set(range(1, 11))) == 3 and len(held & {11, 12, 13}) == 1
    assert 20 not in held  # the only document of its label stays in training


def test_vote_evidence_shares_and_empty_rows() -> None:
    from engine.router import vote_evidence

    scores = np.array([[0.9, 0.9, 0.5], [0.8, -np.inf, -np.inf], [-np.inf, -np.inf, -np.inf]], dtype=np.float32)
    classes = np.array([[0, 1, 1], [2, -1, -1], [-1, -1, -1]])
    share = np.exp(vote_evidence(scores, classes, 3, sharpness=10.0, alpha=0.0 + 1e-9))  # [3, 3]
    far = float(np.exp(-4.0))  # 0.5 is 0.4 below the best: weight e^(-10 * 0.4)
    assert share[0].tolist() == pytest.approx([1 / (2 + far), (1 + far) / (2 + far), 0.0], abs=1e-6)
    assert share[1].tolist() == pytest.approx([0.0, 0.0, 1.0], abs=1e-6)  # empty slots do not vote
    assert share[2].tolist() == pytest.approx([1 / 3] * 3)  # no hits: uniform, which the softmax ignores
    smoothed = np.exp(vote_evidence(scores, classes, 3, sharpness=10.0, alpha=0.5))
    assert float(smoothed[1, 0]) == pytest.approx(0.5 / 2.5) and np.allclose(smoothed.sum(1), np.ones(3))


def test_without_self_drops_the_own_id_or_the_last() -> None:
    from engine.router_training import without_self

    scores = np.array([[0.9, 0.8, 0.7], [0.9, 0.8, 0.7], [0.9, -np.inf, -np.inf]], dtype=np.float32)
    ids = np.array([[5, 6, 7], [1, 2, 3], [4, -1, -1]], dtype=np.int64)
    s, i = without_self(scores, ids, np.array([6, 9, -1]), 2)
    assert i.tolist() == [[5, 7], [1, 2], [4, -1]]
    assert s[0].tolist() == pytest.approx([0.9, 0.7])


def test_the_vote_is_fitted_and_travels_with_the_router() -> None:
    """Neighbours whose lists belong to the true class: the fit gives the vote weight, routing uses it."""
    x, calib, scores, lists, data = voted(share=0.8)
    net, t, metrics = train(data, TrainConfig(hidden=16, epochs=5))
    assert metrics["vote_weight"] > 0 and metrics["accuracy"] > 0.9
    router = Router(net, t, expert_ids=[10, 20])
    assert router.probe_size == (2, 5)
    neighbours = (scores[:4], lists[:4])
    with_votes = router.logits(x[calib][:4], neighbours)
    assert not torch.allclose(with_votes, router.logits(x[calib][:4]))
    restored = Router.from_state(router.state_bytes(), dim=16, hidden=16, expert_ids=[10, 20], temperature=t)
    assert restored.probe_size == (2, 5)
    assert torch.allclose(restored.logits(x[calib][:4], neighbours), with_votes)


def test_bm25_hits_hold_half_of_the_vote_and_veto_nothing() -> None:
    """Dense neighbours all in class 0, BM25 hits all in class 1: each class keeps half the vote."""
    from engine.router import GateNet

    net = GateNet(4, 3, hidden=4, n_lists=3)
    net.set_lists(np.eye(3, 4, dtype=np.float32), np.arange(3, dtype=np.int64))
    net.vote_params[4] = 1e-6  # (almost) no smoothing: shares read plainly
    dense = (np.full((2, 3), 0.8, dtype=np.float32), np.zeros((2, 3), dtype=np.int64))  # [Q, M]
    bm25 = (np.array([[9.0, 4.5, 0.0], [0.0, 0.0, 0.0]], dtype=np.float32), np.array([[1, 1, -1], [-1, -1, -1]]))
    shares = np.exp(net.votes(dense, bm25))  # [2, 3]
    assert shares[0].tolist() == pytest.approx([0.5, 0.5, 0.0], abs=1e-4)  # pooled: both classes stay possible
    assert shares[1].tolist() == pytest.approx(np.exp(net.votes(dense)[1]).tolist())  # no hits: the dense vote alone
    scaled = net.votes(dense, (bm25[0] * 7, bm25[1]))
    assert np.allclose(scaled, net.votes(dense, bm25))  # BM25 counts relative to the row's best


def test_bm25_hits_share_the_fitted_vote_and_travel_with_the_router() -> None:
    x, y = blobs(150, 3, spread=1.5)  # overlapping: the MLP alone is unsure
    calib = np.random.default_rng(1).random(len(y)) < 0.4
    held = int(calib.sum())
    rng = np.random.default_rng(2)
    lists = np.where(rng.random((held, 5)) < 0.6, y[calib][:, None], (y[calib][:, None] + 1) % 3)
    hit_lists = np.where(rng.random((held, 5)) < 0.8, y[calib][:, None], (y[calib][:, None] + 2) % 3)
    hit_lists[::3] = -1  # a third of the rows (whole chunks, say) have no BM25 hits
    scores, bm25 = np.full((held, 5), 0.8, dtype=np.float32), rng.uniform(1, 9, (held, 5)).astype(np.float32)
    data = TrainingSet(
        x, y, calib, 3, x[:3].copy(), np.arange(3, dtype=np.int64), (scores, lists), (2, 5), (bm25, hit_lists)
    )
    net, t, metrics = train(data, TrainConfig(hidden=16, epochs=5))
    assert metrics["vote_weight"] > 0
    router = Router(net, t, expert_ids=[10, 20])
    assert router.lexical_chunks == 5
    neighbours, hits = (scores[1:5], lists[1:5]), (bm25[1:5], hit_lists[1:5])
    pooled = router.logits(x[calib][1:5], neighbours, hits)
    assert not torch.allclose(pooled, router.logits(x[calib][1:5], neighbours))
    restored = Router.from_state(router.state_bytes(), dim=16, hidden=16, expert_ids=[10, 20], temperature=t)
    assert restored.lexical_chunks == 5
    assert torch.allclose(restored.logits(x[calib][1:5], neighbours, hits), pooled)
    without = train(
        TrainingSet(x, y, calib, 3, x[:3].copy(), np.arange(3, dtype=np.int64), (scores, lists), (2, 5)),
        TrainConfig(hidden=16, epochs=5),
    )[0]
    assert Router(without, t, [10, 20]).lexical_chunks == 0  # trained without BM25: serving asks for none


def test_training_finds_bm25_hits_for_question_like_rows_only_and_never_their_own_chunk() -> None:
    from app.services.routing import RouterManager
    from engine.lexical import LexicalIndex
    from index import ClusteredIndex

    texts = ["git rebase replays commits", "git merge joins", "sqlite vacuum", "sqlite wal", "rebase onto", "wal mode"]
    index = ClusteredIndex.create(np.eye(2, 4, dtype=np.float32), "v")
    index.add(np.eye(6, 4, dtype=np.float32)[[0, 0, 1, 1, 0, 1]], np.arange(6), np.array([0, 0, 1, 1, 0, 1]))
    bm25 = LexicalIndex(range(6), texts)
    manager = RouterManager(None, None, None, lambda: index, lambda: bm25)  # type: ignore[arg-type]
    x = np.zeros((8, 4), dtype=np.float32)  # rows 0-5: the chunks; 6-7: samples drawn from chunks 0 and 3
    data = TrainingSet(x, np.zeros(8, dtype=np.int64), np.array([1, 0, 0, 0, 0, 0, 1, 1], dtype=bool), 3)
    own = np.array([0, 1, 2, 3, 4, 5, 0, 3])
    manager._lexical_probe(data, own, ["git rebase", "sqlite wal"], n_chunks=6)
    assert data.lexical is not None
    scores, lists = data.lexical  # [H=3, 5]: held-out rows 0 (a chunk), 6 and 7 (samples)
    assert (lists[0] == -1).all()  # a whole chunk gets no BM25 hits: it votes with its neighbours alone
    assert lists[1].tolist()[:2] == [0, 0] and (lists[1][2:] == -1).all()  # "git rebase": chunks 4 and 1, not 0
    assert lists[2].tolist()[:2] == [1, 1] and scores[2, 0] > 0  # "sqlite wal": chunks 5, 2 (3 is its own)


def test_a_router_saved_before_the_vote_loads_without_one() -> None:
    x, y = blobs(40, 2)
    net, t, _ = train(TrainingSet(x, y, np.arange(len(y)) % 3 == 0, 2), TrainConfig(hidden=8, epochs=2))
    state = {k: v for k, v in net.state_dict().items() if k not in ("vote_params", "lexical_params")}
    buf = __import__("io").BytesIO()
    torch.save(state, buf)
    old = Router.from_state(buf.getvalue(), dim=16, hidden=8, expert_ids=[1], temperature=t)
    assert old.probe_size == (0, 0) and old.lexical_chunks == 0
    assert torch.allclose(old.logits(x[:3]), Router(net, t, [1]).logits(x[:3]))


def test_ece_noise_floor_shrinks_with_more_questions() -> None:
    from engine.calibration import ece_noise_floor

    few = ece_noise_floor(torch.full((50,), 0.8), rounds=300)
    many = ece_noise_floor(torch.full((5000,), 0.8), rounds=300)
    assert 0.02 < few["mean"] < 0.1 and many["mean"] < 0.01 and few["p95"] >= few["mean"]


def test_lowest_ece_by_temperature_finds_the_temperature_that_matches_accuracy() -> None:
    """Four rows alike, three right: the T giving confidence 0.75 (2 / T = ln 3) has ECE 0."""
    import math

    from engine.calibration import expected_calibration_error, lowest_ece_by_temperature

    logits = torch.tensor([[2.0, 0.0]] * 4)  # [4, 2]
    labels = torch.tensor([0, 0, 0, 1])
    exact = 2 / math.log(3)
    bound = lowest_ece_by_temperature(logits, labels, [1.0, exact, 4.0])
    assert bound["temperature"] == exact and bound["ece"] == pytest.approx(0.0, abs=1e-6)
    at_one = expected_calibration_error(torch.softmax(logits, -1), labels)  # 0.88 said, 0.75 right
    assert 0 < lowest_ece_by_temperature(logits, labels)["ece"] < at_one  # the default grid gets close


def test_bm25_rebuilds_are_spaced_to_a_share_of_the_time(runtime) -> None:  # type: ignore[no-untyped-def]
    """The soak found BM25 rebuilt over every chunk at each checkpoint under steady ingestion."""
    from app.serving.lexical import LexicalManager

    now = [100.0]

    def clock() -> float:
        now[0] += 0.5  # every reading of the clock: half a second later (a rebuild "takes" 0.5 s)
        return now[0]

    manager = LexicalManager(runtime.sessions, max_share=0.1, clock=clock)
    assert manager.refresh(force=True)  # took 0.5 s: the next waits until 5 s after its start
    manager.mark_dirty()
    assert not manager.refresh()  # too soon: deferred, still dirty
    now[0] += 5.0
    assert manager.refresh()  # due now
    assert not manager.refresh()  # clean
    manager.mark_dirty()
    assert manager.refresh(force=True)  # forced: at once


def test_served_logits_carry_the_probe_and_bm25_votes_as_ask_does() -> None:
    """`moerag router eval` and the routing report score the gate with both votes, as /ask does."""
    from engine.lexical import LexicalIndex
    from engine.router import GateNet
    from index import ClusteredIndex

    index = ClusteredIndex.create(np.eye(2, 4, dtype=np.float32), "v")
    index.add(np.eye(6, 4, dtype=np.float32)[[0, 0, 0, 1, 1, 1]], np.arange(6), np.array([0, 0, 0, 1, 1, 1]))
    bm25 = LexicalIndex(range(6), ["git a", "git b", "git c", "wal a", "wal b", "wal c"])
    net = GateNet(4, 3, hidden=4, n_lists=2)
    net.set_lists(np.eye(2, 4, dtype=np.float32), np.array([0, 1]))
    net.vote_params[:3] = torch.tensor([1.0, 2.0, 3.0])  # the vote counts: 2 lists probed, 3 chunks voting
    net.lexical_params[:2] = torch.tensor([1.0, 3.0])  # BM25's 3 best chunks share it
    router = Router(net, 1.0, expert_ids=[10, 20])
    q = np.eye(1, 4, dtype=np.float32)  # nearest list 0 (class 0); the words point at class 1
    served = router.served_logits(index, q, [bm25.query("wal")])  # [1, 3]
    neighbours, _ = router.probe(index, q)
    assert torch.allclose(served, router.logits(q, neighbours, router.lexical_probe(index, [bm25.query("wal")])))
    assert float(served[0, 1] - router.logits(q, neighbours)[0, 1]) > 0.5  # BM25's share moved class 1 up
    assert torch.allclose(router.served_logits(index, q, None), router.logits(q, neighbours))  # no BM25 index


def test_lists_map_to_the_routers_own_classes_and_unknown_lists_to_none() -> None:
    """-1 slots and lists the router never saw (an index reclustered with more lists) vote for no class."""
    from engine.router import GateNet

    net = GateNet(4, 3, hidden=4, n_lists=3)
    net.set_lists(np.eye(3, 4, dtype=np.float32), np.array([2, 0, 1]))
    assert net.classes_of(np.array([[0, 1, 2], [-1, 3, 99], [-2, -3, 0]])).tolist() == [
        [2, 0, 1],
        [-1, -1, -1],
        [-1, -1, 2],  # any negative id is no list, not a count from the end
    ]
    bare = GateNet(4, 3, hidden=4)  # a router trained without lists: every list is unknown
    assert bare.classes_of(np.array([[0, -1]])).tolist() == [[-1, -1]]
    assert net.evidence(np.eye(1, 4, dtype=np.float32)).shape == (1, 3)
    assert float(bare.evidence(np.eye(1, 4, dtype=np.float32)).max()) == -1.0  # no class owns a list
