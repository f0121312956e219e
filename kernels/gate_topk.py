"""Fused router gate: softmax(logits / T) -> top-k -> optional renormalisation.

Tie rule (both implementations): among equal probabilities the lower expert id comes first.
Shapes: Q queries, E experts, K kept experts (1 <= K <= E).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import backend


@triton.jit
def _gate_topk_kernel(  # type: ignore[no-untyped-def]  # Triton types come from the launch
    logits_ptr,
    weights_ptr,
    ids_ptr,
    E,
    stride_q,
    inv_t,
    BLOCK_E: tl.constexpr,
    K: tl.constexpr,
    RENORM: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_E)  # [BLOCK_E]; lanes >= E are masked
    mask = offs < E
    x = tl.load(logits_ptr + row * stride_q + offs, mask=mask, other=-float("inf")).to(tl.float32)
    x = x * inv_t
    x = x - tl.max(x, axis=0)
    num = tl.where(mask, tl.exp(x), 0.0)
    p = num / tl.sum(num, axis=0)  # [BLOCK_E] probabilities
    p = tl.where(mask, p, -1.0)  # masked lanes can never be selected
    kept = 0.0
    for r in tl.static_range(K):
        best = tl.max(p, axis=0)
        idx = tl.argmax(p, axis=0, tie_break_left=True)  # lowest id among ties
        tl.store(weights_ptr + row * K + r, best)
        tl.store(ids_ptr + row * K + r, idx.to(tl.int64))
        kept += best
        p = tl.where(offs == idx, -1.0, p)
    if RENORM:
        for r in tl.static_range(K):
            w = tl.load(weights_ptr + row * K + r)
            tl.store(weights_ptr + row * K + r, w / kept)


def _check(logits: torch.Tensor, temperature: float, k: int) -> None:
    if logits.ndim != 2:
        raise ValueError(f"logits must be [Q, E], got {tuple(logits.shape)}")
    if not 1 <= k <= logits.shape[1]:
        raise ValueError(f"k must be in 1..E={logits.shape[1]}, got {k}")
    if not temperature > 0:
        raise ValueError("temperature must be positive")


def gate_topk_triton(
    logits: torch.Tensor, temperature: float, k: int, renormalize: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    _check(logits, temperature, k)
    backend.check_launchable(logits)
    logits = logits.contiguous()
    q, e = logits.shape
    weights = torch.empty((q, k), dtype=torch.float32, device=logits.device)  # [Q, K]
    ids = torch.empty((q, k), dtype=torch.int64, device=logits.device)  # [Q, K]
    if q:
        _gate_topk_kernel[(q,)](
            logits,
            weights,
            ids,
            e,
            logits.stride(0),
            1.0 / temperature,
            BLOCK_E=triton.next_power_of_2(e),
            K=k,
            RENORM=renormalize,
        )
    return weights, ids


def gate_topk_torch(
    logits: torch.Tensor, temperature: float, k: int, renormalize: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    _check(logits, temperature, k)
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # [Q, E]
    # A stable descending sort keeps the lower expert id first among ties; torch.topk does not promise that.
    weights, ids = torch.sort(probs, dim=-1, descending=True, stable=True)  # [Q, E]
    weights, ids = weights[:, :k].contiguous(), ids[:, :k].contiguous()  # [Q, K]
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def gate_topk(
    logits: torch.Tensor, temperature: float = 1.0, k: int = 1, renormalize: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [Q, E] -> (weights [Q, K] float32, ids [Q, K] int64), on the process's backend where the
    logits are (`backend.use_triton`: CPU logits take the twin)."""
    if backend.use_triton(logits):
        return gate_topk_triton(logits, temperature, k, renormalize)
    return gate_topk_torch(logits, temperature, k, renormalize)
