"""Expert-scoped inner-product search over embeddings laid out contiguously by expert.

Layout: rows of `x` [N, D] sorted by expert; `offsets` [E+1] (CSR) so expert e owns rows
offsets[e]:offsets[e+1]. `experts` [Q, S] lists the experts each query searches (-1 = padding;
empty experts are legal). Each (query, expert) pair keeps its top R, then the pairs of a query
are merged. Returns scores [Q, R] float32 and row positions [Q, R] int64 (-1 where fewer than R
rows exist). Tie rule: equal scores keep the lower row first. List an expert once per query.
`scoped_search_triton` runs kernels.scoped_split (shaped for the GPU); the torch twin here is its
oracle.
"""

from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl

from kernels import backend
from kernels.scoped_split import scoped_search_split

log = logging.getLogger(__name__)


@triton.jit
def _scoped_topr_kernel(  # type: ignore[no-untyped-def]  # Triton types come from the launch
    x_ptr,
    q_ptr,
    offsets_ptr,
    experts_ptr,
    out_s_ptr,
    out_i_ptr,
    D,
    S,
    stride_x,
    stride_q,
    stride_e,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    R: tl.constexpr,
):
    qi = tl.program_id(0)
    si = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, BLOCK_R)
    query = tl.load(q_ptr + qi * stride_q + offs_d, mask=offs_d < D, other=0.0).to(tl.float32)  # [BLOCK_D]
    # Running top-R: empty slots hold -inf; lanes >= R hold +inf so they are never the minimum.
    best_s = tl.where(offs_r < R, -float("inf"), float("inf"))  # [BLOCK_R]
    best_i = tl.full((BLOCK_R,), -1, dtype=tl.int64)
    expert = tl.load(experts_ptr + qi * stride_e + si)
    if expert >= 0:
        start = tl.load(offsets_ptr + expert)
        end = tl.load(offsets_ptr + expert + 1)
        for block in range(start, end, BLOCK_N):
            rows = block + offs_n  # [BLOCK_N]
            valid = rows < end
            tile = tl.load(
                x_ptr + rows[:, None] * stride_x + offs_d[None, :],
                mask=valid[:, None] & (offs_d[None, :] < D),
                other=0.0,
            ).to(tl.float32)  # [BLOCK_N, BLOCK_D]
            scores = tl.sum(tile * query[None, :], axis=1)  # [BLOCK_N]
            scores = tl.where(valid, scores, -float("inf"))
            for _ in tl.static_range(R):
                top = tl.max(scores, axis=0)
                at = tl.argmax(scores, axis=0, tie_break_left=True)
                slot = tl.argmin(best_s, axis=0, tie_break_left=True)
                # Strictly greater: an equal score from a later row never displaces an earlier one.
                take = (offs_r == slot) & (best_s < top)  # at `slot`, best_s == worst
                best_s = tl.where(take, top, best_s)
                best_i = tl.where(take, (block + at).to(tl.int64), best_i)
                scores = tl.where(offs_n == at, -float("inf"), scores)
    out = (qi * S + si) * R + offs_r
    tl.store(out_s_ptr + out, best_s, mask=offs_r < R)
    tl.store(out_i_ptr + out, best_i, mask=offs_r < R)


def _check(x: torch.Tensor, queries: torch.Tensor, offsets: torch.Tensor, experts: torch.Tensor, r: int) -> None:
    if x.ndim != 2 or queries.ndim != 2 or x.shape[1] != queries.shape[1]:
        raise ValueError(f"need x [N, D] and queries [Q, D], got {tuple(x.shape)} and {tuple(queries.shape)}")
    if offsets.ndim != 1 or experts.ndim != 2 or experts.shape[0] != queries.shape[0]:
        raise ValueError("need offsets [E+1] and experts [Q, S]")
    if r < 1:
        raise ValueError("r must be positive")
    n_experts = offsets.shape[0] - 1
    if experts.numel() and int(experts.max()) >= n_experts:
        raise ValueError(f"expert id out of range 0..{n_experts - 1}")


def _merge(scores: torch.Tensor, rows: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-pair candidates [Q, S*R] -> the best R per query, ties to the lower row."""
    key_rows = torch.where(rows < 0, torch.iinfo(torch.int64).max, rows)
    order = torch.argsort(key_rows, dim=1, stable=True)  # row ascending first...
    scores, rows = scores.gather(1, order), rows.gather(1, order)
    order = torch.argsort(scores, dim=1, descending=True, stable=True)  # ...then score, stably
    scores, rows = scores.gather(1, order)[:, :r], rows.gather(1, order)[:, :r]
    if scores.shape[1] < r:  # fewer candidates than R: pad
        pad = r - scores.shape[1]
        scores = torch.nn.functional.pad(scores, (0, pad), value=float("-inf"))
        rows = torch.nn.functional.pad(rows, (0, pad), value=-1)
    rows = torch.where(torch.isinf(scores) & (scores < 0), -1, rows)
    return scores.contiguous(), rows.contiguous()


def scoped_search_triton(
    x: torch.Tensor, queries: torch.Tensor, offsets: torch.Tensor, experts: torch.Tensor, r: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton kernel: `kernels.scoped_split` (segments split over many programs, queries of one
    expert read its rows together, a merge pass). Should it fail to build or run on this GPU (a
    Triton version it was never compiled with), the error is logged once and the serial kernel
    answers from then on: slower, never wrong."""
    global _split_failed
    _check(x, queries, offsets, experts, r)
    if _split_failed is None:
        try:
            return scoped_search_split(x, queries, offsets, experts, r)
        except ValueError:
            raise
        except Exception as exc:  # a compile or launch failure of this Triton on this GPU
            _split_failed = f"{type(exc).__name__}: {exc}"[:500]
            log.exception("the split scoped-search kernel failed here; the serial kernel answers from now on")
    return scoped_search_triton_serial(x, queries, offsets, experts, r)


_split_failed: str | None = None  # why the split kernel is not used in this process (None: it is)


def kernel_in_use() -> str:
    """What answers scoped searches on the GPU in this process, in words (for /readyz)."""
    if backend.current() != "triton":
        return "torch twin"
    return "split" if _split_failed is None else f"serial (the split kernel failed: {_split_failed})"


def scoped_search_triton_serial(
    x: torch.Tensor, queries: torch.Tensor, offsets: torch.Tensor, experts: torch.Tensor, r: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first kernel, kept to measure against: one program a (query, expert) pair walks the whole
    segment, R max-reductions a tile (one of a GPU's many SMs a query: 28-2,000x slower than torch
    on an H200)."""
    _check(x, queries, offsets, experts, r)
    backend.check_launchable(x, queries, offsets, experts)
    x, queries = x.contiguous(), queries.contiguous()
    offsets, experts = offsets.to(torch.int64).contiguous(), experts.to(torch.int64).contiguous()
    q, s = experts.shape
    cand_s = torch.empty((q, s * r), dtype=torch.float32, device=x.device)  # [Q, S*R]
    cand_i = torch.empty((q, s * r), dtype=torch.int64, device=x.device)  # [Q, S*R]
    if q and s:
        _scoped_topr_kernel[(q, s)](
            x,
            queries,
            offsets,
            experts,
            cand_s,
            cand_i,
            x.shape[1],
            s,
            x.stride(0),
            queries.stride(0),
            experts.stride(0),
            BLOCK_N=64,
            BLOCK_D=triton.next_power_of_2(x.shape[1]),
            BLOCK_R=triton.next_power_of_2(r),
            R=r,
        )
    return _merge(cand_s, cand_i, r)


def scoped_search_torch(
    x: torch.Tensor, queries: torch.Tensor, offsets: torch.Tensor, experts: torch.Tensor, r: int
) -> tuple[torch.Tensor, torch.Tensor]:
    _check(x, queries, offsets, experts, r)
    q, s = experts.shape
    cand_s = torch.full((q, s * r), float("-inf"), dtype=torch.float32, device=x.device)  # [Q, S*R]
    cand_i = torch.full((q, s * r), -1, dtype=torch.int64, device=x.device)  # [Q, S*R]
    bounds = offsets.tolist()
    for qi, row in enumerate(experts.tolist()):
        for si, e in enumerate(row):
            if e < 0 or bounds[e] == bounds[e + 1]:
                continue
            a, b = bounds[e], bounds[e + 1]
            scores = x[a:b].float() @ queries[qi].float()  # [n_e], a view of the segment: no copy
            top, at = torch.sort(scores, descending=True, stable=True)  # ties: lower row first
            n = min(r, b - a)
            cand_s[qi, si * r : si * r + n] = top[:n]
            cand_i[qi, si * r : si * r + n] = at[:n] + a
    return _merge(cand_s, cand_i, r)


def scoped_search(
    x: torch.Tensor, queries: torch.Tensor, offsets: torch.Tensor, experts: torch.Tensor, r: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, D], queries [Q, D], offsets [E+1], experts [Q, S] -> (scores [Q, R], rows [Q, R]), on the
    process's backend where the data is (`backend.use_triton`)."""
    if backend.use_triton(x, queries, offsets, experts):
        return scoped_search_triton(x, queries, offsets, experts, r)
    return scoped_search_torch(x, queries, offsets, experts, r)
