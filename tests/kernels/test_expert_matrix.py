import numpy as np

from engine.expert_matrix import ExpertMatrix


def test_expert_matrix_searches_only_the_chosen_experts_rows() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((60, 8)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ids = np.arange(100, 160, dtype=np.int64)
    experts = np.array([7, 9, -1] * 20, dtype=np.int64)  # -1: a chunk no expert owns
    m = ExpertMatrix(ids, x, experts, [7, 9])
    scores, got = m.search(x[:2], [9], 5)
    assert np.allclose(scores[0], np.sort(x[experts == 9] @ x[0])[::-1][:5], atol=1e-5)
    owned = set(ids[experts == 9].tolist())
    assert set(got.ravel().tolist()) <= owned
    expected = ids[experts == 9][np.argsort(-(x[experts == 9] @ x[0]), kind="stable")[:5]]
    assert got[0].tolist() == expected.tolist()
    assert m.sizes([9]) == 20 and m.sizes([7, 9]) == 40 and m.sizes([3]) == 0


def test_expert_matrix_with_no_owned_chunks() -> None:
    x = np.ones((3, 4), dtype=np.float32) / 2
    m = ExpertMatrix(np.arange(3, dtype=np.int64), x, np.full(3, -1, dtype=np.int64), [1])
    scores, got = m.search(x[:1], [1], 2)
    assert (got == -1).all() and np.isinf(scores).all()


def test_under_the_triton_backend_a_matrix_searches_with_what_it_measured_faster(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Issue 37 #2: `auto` never keeps a slower path. Here (Triton's interpreter on a CPU) the twin
    is far faster, so the matrix searches with it and says why; the answers are the twin's either way."""
    from kernels import backend

    monkeypatch.setattr(backend, "_chosen", "triton")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((300, 8)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    experts = np.array([1] * 200 + [2] * 100, dtype=np.int64)
    m = ExpertMatrix(np.arange(300, dtype=np.int64), x, experts, [1, 2])
    assert m.kernel.startswith("torch: measured faster") and "200 rows" in m.kernel and "triton" in m.kernel
    _, got = m.search(x[:1], [1], 5)
    assert got[0].tolist() == np.argsort(-(x[:200] @ x[0]), kind="stable")[:5].tolist()
    # The next state's matrix keeps the choice while the largest expert stays within 2x; past that it times again.
    timed: list[int] = []
    monkeypatch.setattr(ExpertMatrix, "choose", lambda self, *a: timed.append(1) or "")
    same = ExpertMatrix(np.arange(300, dtype=np.int64), x, experts, [1, 2], previous=m)
    assert same.kernel == m.kernel and same.measured_rows == 200 and not timed
    small = np.array([1] * 90 + [2] * 210, dtype=np.int64)  # largest 210: kept
    assert ExpertMatrix(np.arange(300, dtype=np.int64), x, small, [1, 2], previous=m).kernel == m.kernel and not timed
    grown = np.ones(450, dtype=np.int64)  # largest 450 rows, past twice the 200 measured: timed again
    ExpertMatrix(np.arange(450, dtype=np.int64), np.vstack([x, x[:150]]), grown, [1, 2], previous=m)
    assert timed == [1]
    monkeypatch.setattr(backend, "_chosen", "torch")
    assert ExpertMatrix(np.arange(300, dtype=np.int64), x, experts, [1, 2]).kernel == "by the backend"
