import numpy as np
import pytest
import torch

from engine.calibration import coverage_at, expected_calibration_error, fit_temperature
from engine.router import Router, TrainConfig, TrainingSet, class_weights, train
from engine.samples import query_like_samples


def blobs(
    n_per: int, n_classes: int, dim: int = 16, spread: float = 0.6, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((n_classes, dim))
    x = np.concatenate([c + spread * rng.standard_normal((n_per, dim)) for c in centers]).astype(np.float32)
    y = np.repeat(np.arange(n_classes), n_per).astype(np.int64)
    return x / np.linalg.norm(x, axis=1, keepdims=True), y


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


def test_held_out_documents_are_whole_and_every_expert_keeps_training_documents() -> None:
    from engine.samples import held_out_documents

    # Documents 1-10 mostly of label 0, 11-13 of label 1, 20 alone of label 2; one chunk per row.
    documents = [d for d in range(1, 11) for _ in range(3)] + [11, 11, 12, 13] + [20, 20]
    labels = [0] * 30 + [1, 0, 1, 1] + [2, 2]
    held = held_out_documents(documents, labels, 0.3, seed=0)
    assert held == held_out_documents(documents, labels, 0.3, seed=0)  # deterministic
    assert len(held & set(range(1, 11))) == 3 and len(held & {11, 12, 13}) == 1
    assert 20 not in held  # the only document of its label stays in training
