"""Expert-scoped search shaped for the GPU: every expert segment split over many programs, the
queries that search one expert read its rows together, and a merge pass over the splits' top R.

Same contract as `kernels.scoped_search` (whose torch twin is the oracle): rows of `x` [N, D]
sorted by expert, `offsets` [E+1] (CSR: expert e owns rows offsets[e]:offsets[e+1]), `experts`
[Q, S] the experts each query searches (-1 = padding; list an expert once per query). Returns
scores [Q, R] float32 and rows [Q, R] int64 (-1 and -inf where fewer than R rows exist); equal
scores keep the lower row first. `x` may be float32, float16 or bfloat16: rows and queries are
read as float32 and scores accumulate in float32.

1. **Align** (torch, no host sync): the (query, slot) pairs are grouped by expert into tiles of
   BLOCK_Q pairs, as vLLM's fused MoE aligns tokens to experts; at most ceil(P / BLOCK_Q) + E
   tiles, unused ones marked -1.
2. **Split top-R** (Triton): grid (split, tile). A program reads BLOCK_N rows of its tile's
   expert once for all BLOCK_Q queries (`tl.dot` of [BLOCK_Q, BLOCK_D] by [BLOCK_D, BLOCK_N]
   over D, full float32 precision; one query: a multiply-and-sum), turns each score and row into
   one int64 key (the score's order-preserving bits above, the row's complement below: the
   larger key is the better score, then the lower row), sorts each query's keys and keeps the
   first R.
3. **Merge** (torch): the best R keys of each query over its slots and splits (`torch.topk`),
   decoded back to scores and rows (FAISS GPU's k-selection merge pass).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import backend

EMPTY = -(2**63)  # the key of no row: below every real key
LOW = 0xFFFFFFFF  # the key's low half holds LOW - row: rows below 2**32
_EMPTY: tl.constexpr = tl.constexpr(EMPTY)  # the same, for the kernel
_LOW: tl.constexpr = tl.constexpr(LOW)


def _configs() -> list[triton.Config]:
    if backend.interpreter_on():  # the interpreter runs every config: one is enough there
        return [triton.Config({"BLOCK_D": 32}, num_warps=4)]
    return [triton.Config({"BLOCK_D": d}, num_warps=w, num_stages=s) for d in (32, 64) for w in (4, 8) for s in (2, 3)]


@triton.autotune(configs=_configs(), key=["D", "BLOCK_N", "BLOCK_Q", "R"])
@triton.jit
def _split_topr_kernel(  # type: ignore[no-untyped-def]  # Triton types come from the launch
    x_ptr,
    q_ptr,
    offsets_ptr,
    tile_expert_ptr,
    tile_pairs_ptr,
    out_ptr,
    D,
    S,
    SPLITS,
    stride_x,
    stride_q,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    R: tl.constexpr,
):
    pi = tl.program_id(0)  # the split: axis 0, the one a CUDA grid lets exceed 65,535
    ti = tl.program_id(1)
    expert = tl.load(tile_expert_ptr + ti)
    if expert < 0:  # a tile the alignment did not need
        return
    start = tl.load(offsets_ptr + expert)
    end = tl.load(offsets_ptr + expert + 1)
    first = start + pi * BLOCK_N
    if first >= end:  # this expert is shorter than the longest: nothing in this split
        return
    offs_q = tl.arange(0, BLOCK_Q)
    offs_n = tl.arange(0, BLOCK_N)
    pairs = tl.load(tile_pairs_ptr + ti * BLOCK_Q + offs_q)  # [BLOCK_Q] pair = query * S + slot; -1: none
    queries = tl.where(pairs >= 0, pairs // S, 0)  # [BLOCK_Q]
    rows = first + offs_n  # [BLOCK_N]
    valid = rows < end
    acc = tl.zeros((BLOCK_Q, BLOCK_N), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        in_d = offs_d < D
        q = tl.load(
            q_ptr + queries[:, None] * stride_q + offs_d[None, :],
            mask=(pairs[:, None] >= 0) & in_d[None, :],
            other=0.0,
        ).to(tl.float32)  # [BLOCK_Q, BLOCK_D]
        x = tl.load(
            x_ptr + rows[:, None] * stride_x + offs_d[None, :], mask=valid[:, None] & in_d[None, :], other=0.0
        ).to(tl.float32)  # [BLOCK_N, BLOCK_D]
        if BLOCK_Q == 1:
            acc += tl.sum(x[None, :, :] * q[:, None, :], axis=2)
        else:
            acc += tl.dot(q, tl.trans(x), input_precision="ieee")  # [BLOCK_Q, BLOCK_N]
    bits = acc.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # compares as the floats do
    low = tl.full((BLOCK_N,), _LOW, tl.int64) - rows.to(tl.int64)  # [BLOCK_N] lower rows above
    keys = (ordered.to(tl.int64) << 32) | low[None, :]  # [BLOCK_Q, BLOCK_N]
    keys = tl.where(valid[None, :], keys, tl.full((BLOCK_Q, BLOCK_N), _EMPTY, tl.int64))
    keys = tl.sort(keys, dim=1, descending=True)
    out = (pairs * SPLITS + pi) * R  # [BLOCK_Q] where this pair's R keys of this split go
    tl.store(out_ptr + out[:, None] + offs_n[None, :], keys, mask=(pairs[:, None] >= 0) & (offs_n[None, :] < R))


def align(experts: torch.Tensor, n_experts: int, block_q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """experts [Q, S] -> (tile_expert [T], tile_pairs [T, block_q]): the pairs (q * S + slot) of
    each expert in tiles of block_q (-1 fills), T = ceil(P / block_q) + E, no host sync."""
    flat = experts.reshape(-1)  # [P]
    dev = flat.device
    n_tiles = -(-flat.numel() // block_q) + n_experts
    key = torch.where(flat >= 0, flat, n_experts)  # padding sorts last
    order = torch.argsort(key, stable=True)  # [P] pairs grouped by expert, pair order within
    by_expert = key[order]  # [P]
    counts = torch.bincount(key, minlength=n_experts + 1)[:n_experts]  # [E]
    tiles = (counts + block_q - 1) // block_q  # [E]
    tile_start = torch.cumsum(tiles, 0) - tiles  # [E]
    pair_start = torch.cumsum(counts, 0) - counts  # [E]
    real = by_expert < n_experts
    e = torch.where(real, by_expert, 0)
    rank = torch.arange(flat.numel(), device=dev) - pair_start[e]  # [P] place within its expert
    tile = torch.where(real, tile_start[e] + rank // block_q, n_tiles)  # padding: a dropped row
    lane = rank % block_q
    tile_pairs = torch.full((n_tiles + 1, block_q), -1, dtype=torch.int64, device=dev)
    tile_pairs[tile, lane] = order
    tile_expert = torch.full((n_tiles + 1,), -1, dtype=torch.int64, device=dev)
    tile_expert[tile] = torch.where(real, by_expert, -1)
    return tile_expert[:n_tiles].contiguous(), tile_pairs[:n_tiles].contiguous()


def decode(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 keys [...] -> (scores float32, rows int64); EMPTY -> (-inf, -1)."""
    high = (keys >> 32).to(torch.int32)
    bits = torch.where(high >= 0, high, high ^ 0x7FFFFFFF)
    scores = bits.view(torch.float32)
    rows = LOW - (keys & LOW)
    empty = keys == EMPTY
    return torch.where(empty, float("-inf"), scores), torch.where(empty, -1, rows)


def scoped_search_split(
    x: torch.Tensor, queries: torch.Tensor, offsets: torch.Tensor, experts: torch.Tensor, r: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, D] (float32/16, bfloat16), queries [Q, D], offsets [E+1], experts [Q, S] ->
    (scores [Q, R], rows [Q, R]), as `scoped_search_torch` gives them."""
    if x.shape[0] > LOW:
        raise ValueError(f"the split kernel keys rows in 32 bits: {x.shape[0]} rows is too many")
    backend.check_launchable(x, queries, offsets, experts)
    x, queries = x.contiguous(), queries.contiguous()
    offsets, experts = offsets.to(torch.int64).contiguous(), experts.to(torch.int64).contiguous()
    q, s = experts.shape
    n_experts = offsets.shape[0] - 1
    block_n = max(128, triton.next_power_of_2(r))  # the sorted width holds the R kept
    # One query a tile when no expert is searched by many; else tiles of 16-64 queries for tl.dot.
    per_expert = torch.bincount(experts[experts >= 0], minlength=1)
    most, longest = (int(v) for v in torch.stack([per_expert.max(), (offsets[1:] - offsets[:-1]).max()]).tolist())
    block_q = 1 if most <= 2 else min(64, max(16, triton.next_power_of_2(most)))
    splits = max(1, -(-longest // block_n))
    out = torch.full((q * s * splits * r,), EMPTY, dtype=torch.int64, device=x.device)  # [Q*S*SPLITS*R]
    if q and s and longest:
        tile_expert, tile_pairs = align(experts, n_experts, block_q)
        _split_topr_kernel[(splits, tile_expert.shape[0])](
            x,
            queries,
            offsets,
            tile_expert,
            tile_pairs,
            out,
            x.shape[1],
            s,
            splits,
            x.stride(0),
            queries.stride(0),
            BLOCK_Q=block_q,
            BLOCK_N=block_n,
            R=r,
        )
    keys = out.view(q, s * splits * r)  # [Q, S*SPLITS*R]
    if keys.shape[1] < r:
        keys = torch.nn.functional.pad(keys, (0, r - keys.shape[1]), value=EMPTY)
    best = torch.topk(keys, r, dim=1).values  # [Q, R] distinct keys: no ties to break
    scores, rows = decode(best)
    return scores.contiguous(), rows.contiguous()
