import pytest
import torch

from kernels import backend
from kernels.scoped_search import scoped_search, scoped_search_torch, scoped_search_triton, scoped_search_triton_serial
from kernels.scoped_split import align, decode


def layout(sizes: list[int], d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(sizes), d, generator=g)
    x = x / x.norm(dim=1, keepdim=True)
    offsets = torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()], dtype=torch.int64)
    return x, offsets


def test_torch_twin_hand_computed() -> None:
    # Expert 0: rows 0-1, expert 1: empty, expert 2: rows 2-4.
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [0.8, 0.6], [-1.0, 0.0]])
    offsets = torch.tensor([0, 2, 2, 5])
    q = torch.tensor([[1.0, 0.0]])
    s, i = scoped_search_torch(x, q, offsets, torch.tensor([[2, -1]]), 2)
    assert i.tolist() == [[3, 2]] and torch.allclose(s, torch.tensor([[0.8, 0.6]]))
    s, i = scoped_search_torch(x, q, offsets, torch.tensor([[0, 1, 2]]), 3)
    assert i.tolist() == [[0, 3, 2]]
    s, i = scoped_search_torch(x, q, offsets, torch.tensor([[1]]), 2)  # an empty expert
    assert i.tolist() == [[-1, -1]] and torch.isinf(s).all()


def test_ties_keep_the_lower_row() -> None:
    x = torch.tensor([[1.0, 0.0]] * 6)
    offsets = torch.tensor([0, 3, 6])
    q = torch.tensor([[1.0, 0.0]])
    for fn in (scoped_search_torch, scoped_search_triton, scoped_search_triton_serial):
        _, i = fn(x, q, offsets, torch.tensor([[1, 0]]), 4)
        assert i.tolist() == [[0, 1, 2, 3]], fn.__name__
    wide = torch.tensor([[1.0, 0.0]] * 300)  # equal scores across the split kernel's 128-row splits
    _, i = scoped_search_triton(wide, q, torch.tensor([0, 300]), torch.tensor([[0]]), 5)
    assert i.tolist() == [[0, 1, 2, 3, 4]]


@pytest.mark.parametrize(
    ("sizes", "q", "r"),
    [([5], 1, 1), ([5], 2, 10), ([0, 7, 0, 130], 3, 5), ([64, 65, 1, 0, 200], 1, 4), ([3] * 13, 4, 2)],
)
def test_triton_matches_torch(sizes: list[int], q: int, r: int) -> None:
    x, offsets = layout(sizes, d=24, seed=len(sizes) * 7 + q)
    g = torch.Generator().manual_seed(r)
    queries = torch.randn(q, 24, generator=g)
    n_e = len(sizes)
    experts = torch.full((q, min(3, n_e)), -1, dtype=torch.int64)
    for qi in range(q):
        chosen = torch.randperm(n_e, generator=g)[: min(3, n_e)]
        k = 1 + qi % len(chosen)
        experts[qi, :k] = chosen[:k]  # the rest stays -1 padding
    s1, i1 = scoped_search_torch(x, queries, offsets, experts, r)
    for kernel in (scoped_search_triton, scoped_search_triton_serial):
        s2, i2 = kernel(x, queries, offsets, experts, r)
        assert torch.equal(i1, i2), kernel.__name__
        assert torch.allclose(s1, s2, atol=1e-5)
    # Every result belongs to one of the query's experts, and the results are the true best.
    owner = torch.repeat_interleave(torch.arange(n_e), torch.tensor(sizes))
    for qi in range(q):
        allowed = set(experts[qi][experts[qi] >= 0].tolist())
        rows = [int(v) for v in i1[qi] if v >= 0]
        assert all(int(owner[v]) in allowed for v in rows)
        mask = torch.tensor([int(o) in allowed for o in owner.tolist()], dtype=torch.bool)
        expected = sorted((x[mask] @ queries[qi]).tolist(), reverse=True)[:r]
        assert torch.allclose(s1[qi, : len(expected)], torch.tensor(expected), atol=1e-5)


def test_bad_arguments() -> None:
    x, offsets = layout([2, 2], 4, 0)
    with pytest.raises(ValueError, match="out of range"):
        scoped_search_torch(x, torch.zeros(1, 4), offsets, torch.tensor([[2]]), 1)
    with pytest.raises(ValueError):
        scoped_search_torch(x, torch.zeros(1, 5), offsets, torch.tensor([[0]]), 1)


def test_dispatcher_follows_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    x, offsets = layout([3, 4], 8, 1)
    q = torch.randn(2, 8)
    experts = torch.tensor([[0, 1], [1, -1]])
    monkeypatch.setattr(backend, "_chosen", "triton")
    a = scoped_search(x, q, offsets, experts, 3)
    monkeypatch.setattr(backend, "_chosen", "torch")
    b = scoped_search(x, q, offsets, experts, 3)
    assert torch.equal(a[1], b[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_split_kernel_reads_queries_of_one_expert_together(dtype: torch.dtype) -> None:
    """Six queries on two experts (tiles of 16 through `tl.dot`), segments longer than a split, the
    served depth of 50, a store in half precision: the twin's rows on the same stored values."""
    x, offsets = layout([300, 0, 170], d=24, seed=5)
    x = x.to(dtype)
    g = torch.Generator().manual_seed(3)
    queries = torch.randn(6, 24, generator=g)
    experts = torch.tensor([[0, 2], [2, -1], [0, -1], [2, 0], [0, 2], [-1, -1]])
    s1, i1 = scoped_search_torch(x, queries, offsets, experts, 50)
    s2, i2 = scoped_search_triton(x, queries, offsets, experts, 50)
    assert torch.equal(i1, i2) and torch.allclose(s1, s2, atol=1e-5)
    assert (i2[5] == -1).all() and torch.isinf(s2[5]).all()  # a query that searches nothing


def test_alignment_groups_pairs_by_expert_and_keys_decode() -> None:
    experts = torch.tensor([[2, 0], [2, -1], [0, 2]])  # pairs 0..5 = query * 2 + slot
    tile_expert, tile_pairs = align(experts, 3, 2)
    tiles = {(int(e), tuple(p)) for e, p in zip(tile_expert.tolist(), tile_pairs.tolist(), strict=True) if e >= 0}
    assert tiles == {(0, (1, 4)), (2, (0, 2)), (2, (5, -1))} and len(tile_expert) == 3 + 3
    scores = torch.tensor([0.5, -0.25, 0.0, -1.0])
    bits = scores.view(torch.int32)
    ordered = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(torch.int64)
    rows = torch.tensor([7, 3, 0, 2**31])
    keys = (ordered << 32) | (0xFFFFFFFF - rows)
    assert torch.equal(keys.argsort(descending=True), torch.tensor([0, 2, 1, 3]))  # the scores' order
    s, r = decode(torch.cat([keys, torch.tensor([-(2**63)])]))
    assert torch.equal(s[:4], scores) and r.tolist() == [7, 3, 0, 2**31, -1] and s[4] == float("-inf")


def test_a_split_kernel_that_fails_on_a_gpu_leaves_the_serial_kernel_answering(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    module = importlib.import_module("kernels.scoped_search")  # the module (the package exports its function)

    def broken(*_: object) -> None:
        raise RuntimeError("PassManager::run failed")  # as a Triton build failure reads

    monkeypatch.setattr(module, "scoped_search_split", broken)
    monkeypatch.setattr(module, "_split_failed", None)
    x, offsets = layout([4, 5], 8, 2)
    q, experts = torch.randn(2, 8), torch.tensor([[0, 1], [1, -1]])
    _, rows = scoped_search_triton(x, q, offsets, experts, 3)
    assert torch.equal(rows, scoped_search_torch(x, q, offsets, experts, 3)[1])
    assert module._split_failed is not None and "PassManager" in module._split_failed
