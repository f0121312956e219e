import importlib
import math

import pytest
import torch

from kernels import backend
from kernels.gate_topk import gate_topk, gate_topk_torch, gate_topk_triton


def test_torch_twin_hand_computed() -> None:
    logits = torch.tensor([[math.log(1.0), math.log(3.0), math.log(6.0)]])
    w, i = gate_topk_torch(logits, 1.0, 2)
    assert i.tolist() == [[2, 1]]
    assert torch.allclose(w, torch.tensor([[0.6, 0.3]]))
    w, i = gate_topk_torch(logits, 1.0, 2, renormalize=True)
    assert torch.allclose(w, torch.tensor([[6 / 9, 3 / 9]]))
    # Temperature 2 halves the logits: probabilities proportional to sqrt(1), sqrt(3), sqrt(6).
    w, _ = gate_topk_torch(logits, 2.0, 3)
    z = 1 + math.sqrt(3) + math.sqrt(6)
    assert torch.allclose(w, torch.tensor([[math.sqrt(6) / z, math.sqrt(3) / z, 1 / z]]))


def test_ties_go_to_the_lower_expert_id() -> None:
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0, 2.0]])
    for fn in (gate_topk_torch, gate_topk_triton):
        _, ids = fn(logits, 1.0, 4)
        assert ids.tolist() == [[1, 2, 4, 3]], fn.__name__


# The interpreter runs every program in Python: the grid is chosen to cover the edge cases
# (E of 1, not a power of two, past a few hundred; K = 1, K = E; one query and many) cheaply.
@pytest.mark.parametrize(("e", "q"), [(1, 1), (2, 4), (3, 1), (7, 9), (8, 2), (13, 5), (100, 3), (257, 2)])
def test_triton_matches_torch(e: int, q: int) -> None:
    g = torch.Generator().manual_seed(e * 100 + q)
    logits = torch.randn(q, e, generator=g) * 3
    ks = {1, min(2, e), min(5, e)} | ({e} if e <= 13 else set())
    for k in sorted(ks):
        for t, renorm in ((0.5, False), (1.7, True)):
            w1, i1 = gate_topk_torch(logits, t, k, renorm)
            w2, i2 = gate_topk_triton(logits, t, k, renorm)
            assert torch.equal(i1, i2), (e, q, k, t)
            assert torch.allclose(w1, w2, atol=1e-6, rtol=1e-5)
            assert w2.dtype == torch.float32 and i2.dtype == torch.int64


def test_k_equals_e_gives_a_full_sorted_distribution() -> None:
    logits = torch.randn(4, 6)
    w, i = gate_topk_triton(logits, 1.0, 6)
    assert torch.allclose(w.sum(-1), torch.ones(4), atol=1e-6)
    assert torch.all(w[:, :-1] >= w[:, 1:])
    assert sorted(i[0].tolist()) == list(range(6))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        gate_topk_torch(torch.zeros(2, 3), 1.0, 4)
    with pytest.raises(ValueError):
        gate_topk_torch(torch.zeros(2, 3), 0.0, 1)
    with pytest.raises(ValueError):
        gate_topk_triton(torch.zeros(3), 1.0, 1)


def test_dispatcher_uses_the_configured_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    module = importlib.import_module("kernels.gate_topk")  # the package re-exports a function of that name
    logits = torch.randn(3, 5)
    calls: list[str] = []
    monkeypatch.setattr(module, "gate_topk_triton", lambda *a: calls.append("triton") or (None, None))
    monkeypatch.setattr(module, "gate_topk_torch", lambda *a: calls.append("torch") or (None, None))
    monkeypatch.setattr(backend, "_chosen", "torch")
    gate_topk(logits, 1.0, 2)
    monkeypatch.setattr(backend, "_chosen", "triton")
    gate_topk(logits, 1.0, 2)
    assert calls == ["torch", "triton"]


def test_backend_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    assert backend.resolve("torch") == "torch"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert backend.resolve("auto") == "torch"
    assert backend.resolve("triton") == "triton"  # the interpreter is on in tests
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="CUDA"):
        backend.resolve("triton")
    with pytest.raises(RuntimeError, match="CUDA tensors"):
        gate_topk_triton(torch.zeros(1, 3), 1.0, 1)  # never reaches a missing GPU driver
    with pytest.raises(ValueError):
        backend.resolve("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert backend.resolve("auto") == "triton"


def test_under_triton_cpu_logits_take_the_twin_and_never_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 37 #0: the served gate's logits are a CPU tensor (a NumPy MLP); with Triton chosen on
    a CUDA machine every routed question raised "Triton kernels need CUDA tensors". The data
    decides: CPU tensors go to the twin, GPU tensors to the kernel."""
    monkeypatch.setattr(backend, "_chosen", "triton")
    monkeypatch.setattr(backend, "interpreter_on", lambda: False)  # as on a real GPU machine
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0, 2.0]])
    assert not backend.use_triton(logits)
    w, i = gate_topk(logits, 1.0, 2)
    assert i.tolist() == [[1, 2]] and torch.equal(w, gate_topk_torch(logits, 1.0, 2)[0])
    with pytest.raises(RuntimeError, match="CUDA tensors"):  # the kernel itself still refuses them
        gate_topk_triton(logits, 1.0, 2)
