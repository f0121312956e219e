"""The query adapter (engine.adapter): learnt from heading questions, kept only when it helps,
stored with its router version, and read by retrieval but never by the gate."""

import io

import numpy as np
import pytest
import torch

from engine.adapter import AdapterConfig, adapt, fit, recall_at
from engine.pipeline import AskRequest
from engine.question_encoder import done_future
from engine.router import ADAPTER_KEY, Router
from engine.samples import heading_queries
from engine.serving import fixed_state
from tests.test_pipeline_routes import EXPERTS, pipeline, router_with_logits


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def distorted(n: int = 600, dim: int = 16, seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
    """Chunks [n, D] and one query per chunk seen through a fixed linear distortion, plus noise."""
    rng = np.random.default_rng(seed)
    chunks = unit(rng.standard_normal((n, dim)))
    mix = np.eye(dim) + 0.9 * rng.standard_normal((dim, dim))
    queries = unit(chunks @ mix.T + 0.05 * rng.standard_normal((n, dim)))
    return queries, chunks, [[i] for i in range(n)]


def test_the_adapter_learns_what_the_bare_model_misses_and_is_kept() -> None:
    queries, chunks, positives = distorted()
    cfg = AdapterConfig(steps=300, batch=64, negatives=256, pull=0.001, lr=0.01, held_out=0.2)
    w, metrics = fit(queries, chunks, positives, cfg)
    assert w is not None and w.shape == (16, 16) and metrics["adapter"] is True
    assert metrics["adapter_recall_after"] > metrics["adapter_recall_before"] + 0.2
    assert recall_at(w, queries, chunks, positives) > recall_at(None, queries, chunks, positives)
    again, _ = fit(queries, chunks, positives, cfg)  # seeded: the same map twice
    assert again is not None and np.array_equal(w, again)


def test_an_adapter_grown_from_another_starts_there_and_is_pulled_back_to_it() -> None:
    queries, chunks, positives = distorted()
    cfg = AdapterConfig(steps=300, batch=64, negatives=256, pull=0.001, lr=0.01, held_out=0.2)
    broad, _ = fit(queries, chunks, positives, cfg)
    assert broad is not None
    # Nothing left to learn and a strong pull: the narrower adapter stays where it started.
    held = AdapterConfig(steps=20, batch=64, negatives=256, pull=10.0, lr=0.01, held_out=0.2)
    narrow, metrics = fit(queries, chunks, positives, held, init=broad)
    assert narrow is not None and metrics["adapter"] is True
    assert np.abs(narrow - broad).max() < np.abs(broad - np.eye(16)).max() / 10


def test_an_adapter_that_does_not_beat_the_bare_model_is_dropped() -> None:
    _, chunks, positives = distorted()
    w, metrics = fit(chunks.copy(), chunks, positives, AdapterConfig(steps=20, batch=64, negatives=256))
    assert w is None and metrics["adapter"] is False
    assert metrics["adapter_recall_before"] == 1.0 >= metrics["adapter_recall_after"]
    w, metrics = fit(chunks[:10], chunks, positives[:10])  # too few questions to learn from
    assert w is None and metrics == {"adapter_queries": 10, "adapter": False}


def test_adapt_keeps_unit_rows_and_none_is_the_identity() -> None:
    q = unit(np.random.default_rng(3).standard_normal((5, 8)))
    assert adapt(None, q) is q
    out = adapt(np.diag(np.arange(1, 9)).astype(np.float32), q)
    assert out.dtype == np.float32 and np.allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-6)


def test_heading_questions_group_the_chunks_of_one_heading_in_one_document() -> None:
    headings = ["Guide > Installing", "Guide > Installing", "Synopsis", "", "Guide > Installing", "2.1 Upgrades"]
    texts, positives = heading_queries(headings, [1, 1, 1, 1, 2, 2], limit=100)
    assert positives == [[0, 1], [4], [5]]  # generic and empty headings give none
    assert all("Installing" in t for t in texts[:2]) and "Upgrades" in texts[2] and "2.1" not in texts[2]
    texts, positives = heading_queries(headings, [1, 1, 1, 1, 2, 2], limit=2, seed=1)
    assert len(texts) == len(positives) == 2


def test_the_adapter_travels_with_its_router_version() -> None:
    router = router_with_logits([1.0, 0.0, 0.0, 0.0], [1, 2, 3])
    q = unit(np.random.default_rng(0).standard_normal((2, 4)))
    assert router.retrieval_vector(q) is q  # no adapter: the model's vector
    router.adapter = np.diag([1.0, 2.0, 3.0, 4.0]).astype(np.float32)
    restored = Router.from_state(router.state_bytes(), dim=4, hidden=2, expert_ids=[1, 2, 3], temperature=1.0)
    assert restored.adapter is not None and np.array_equal(restored.adapter, router.adapter)
    assert np.allclose(restored.retrieval_vector(q), adapt(router.adapter, q))
    assert torch.allclose(restored.logits(q), router.logits(q))  # the gate is unchanged by it
    old = torch.load(io.BytesIO(router.state_bytes()), weights_only=True)
    del old[ADAPTER_KEY]
    buf = io.BytesIO()
    torch.save(old, buf)  # a version trained before the adapter
    assert Router.from_state(buf.getvalue(), dim=4, hidden=2, expert_ids=[1, 2, 3], temperature=1.0).adapter is None


@pytest.mark.parametrize("use_adapter", [True, False])
def test_retrieval_reads_the_adapted_question_and_the_gate_the_models(use_adapter: bool) -> None:
    """The adapter swaps two axes: the fallback's search finds the chunk on the other axis, the gate
    still sees the model's vector (its route and confidence do not change)."""
    from index import ClusteredIndex

    index = ClusteredIndex.create(np.eye(4, dtype=np.float32), "v")
    index.add(np.eye(4, dtype=np.float32)[[0, 1]], np.array([10, 11]), np.array([0, 1]))

    class Store:
        def fetch(self, ids: list[int]) -> dict[int, object]:
            return {i: i for i in ids}

    router = router_with_logits([1.0, 0.8, 0.0, 0.0], [1, 2, 3])  # unsure: the fallback path
    p = pipeline(router, EXPERTS)
    p.state, p.store = (lambda: fixed_state(index, EXPERTS, router)), Store()  # type: ignore[assignment]
    p.submit_question = lambda text, alone: done_future(np.eye(4, dtype=np.float32)[[0]])  # the model's vector
    plain = p.prepare(AskRequest("q", top_k=1))
    router.adapter = np.eye(4, dtype=np.float32)[[1, 0, 2, 3]]  # axis 0 <-> axis 1
    p.config.query_adapter = use_adapter
    adapted = p.prepare(AskRequest("q", top_k=1))
    assert plain.route.reason == adapted.route.reason == "low_confidence"
    assert [t[1] for t in plain.route.top] == [t[1] for t in adapted.route.top]
    assert [c.chunk for c in plain.citations] == [10]
    assert [c.chunk for c in adapted.citations] == ([11] if use_adapter else [10])
