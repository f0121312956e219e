"""The query adapter: one linear map on the question's vector, learnt from the corpus's own headings.

A general embedding model meets a team's documents cold. The corpus says, without a single
labelled question, which passages answer what: a heading names what the chunks under it are
about. `fit` learns W [D, D] so that normalize(W q) of a heading put as a question ranks the
chunks under it first among the whole store (a softmax over the store, sampled when large),
with W pulled towards the identity so the question keeps what the model saw in it. Only the
question moves: chunk vectors, the index and the embedding cache stay as they are, and the
adapter costs one [D, D] product per question. It is trained with the router, stored in its
version and activated with it (one catalogue version, like every other serving state).

On the eval corpus's dev questions (which no heading names: the recipe removes FAQ questions)
global dense MRR@10 rose 0.596 -> 0.628 (docs/decisions/query-adapter.md); a version keeps its adapter
only when it ranks held-out heading questions better than the bare model does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch


@dataclass(frozen=True)
class AdapterConfig:
    steps: int = 200
    batch: int = 256
    negatives: int = 8192  # store rows sampled per step as the softmax's other candidates
    temperature: float = 0.05  # of the softmax over cosines
    # weight of ||W - I||^2: 0.003-0.1 tried on dev, the strongest kept (docs/decisions/query-adapter.md)
    pull: float = 0.1
    lr: float = 1e-3
    held_out: float = 0.1  # share of the heading questions that judge the adapter, never trained on
    seed: int = 0


def adapt(w: npt.NDArray[np.float32] | None, q: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """q [Q, D] unit rows -> normalize(q W^T) [Q, D]; q itself when there is no adapter."""
    if w is None:
        return q
    x = q @ w.T  # [Q, D]
    return (x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)).astype(np.float32)


def recall_at(
    w: npt.NDArray[np.float32] | None,
    queries: npt.NDArray[np.float32],
    chunks: npt.NDArray[np.float32],
    positives: Sequence[Sequence[int]],
    k: int = 10,
) -> float:
    """Share of queries [N, D] with one of their positives among the k nearest chunks [M, D] (exact)."""
    if len(queries) == 0:
        return 0.0
    found = 0
    q = adapt(w, queries)
    for start in range(0, len(q), 512):
        scores = q[start : start + 512] @ chunks.T  # [n, M]
        top = np.argpartition(-scores, min(k, scores.shape[1] - 1), axis=1)[:, :k]  # [n, k] unordered
        found += sum(bool(set(row.tolist()) & set(positives[start + j])) for j, row in enumerate(top))
    return found / len(q)


def fit(
    queries: npt.NDArray[np.float32],
    chunks: npt.NDArray[np.float32],
    positives: Sequence[Sequence[int]],
    config: AdapterConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
    init: npt.NDArray[np.float32] | None = None,
) -> tuple[npt.NDArray[np.float32] | None, dict[str, float | int | bool]]:
    """queries [N, D] (unit rows), chunks [M, D] (unit rows), each query's positive chunk rows ->
    (W [D, D] or None, metrics). None when the adapter does not beat the bare model on the held-out
    queries (recall@10), or when there is too little to learn from.

    init [D, D]: W starts there and is pulled towards it instead of the identity (a narrower
    adapter grown from a broader one; `adapter-variants-f32.json`)."""
    cfg = config or AdapterConfig()
    report = progress or (lambda d, t: None)
    n, m = len(queries), len(chunks)
    rng = np.random.default_rng(cfg.seed)
    order = rng.permutation(n)
    n_held = round(cfg.held_out * n)
    held, train = order[:n_held], order[n_held:]
    metrics: dict[str, float | int | bool] = {"adapter_queries": int(n)}
    if len(train) < 2 * cfg.batch or n_held == 0 or m < 2:
        return None, metrics | {"adapter": False}
    dim = queries.shape[1]
    anchor = torch.eye(dim) if init is None else torch.from_numpy(np.array(init, dtype=np.float32))  # [D, D]
    w = anchor.clone().requires_grad_(True)
    opt = torch.optim.Adam([w], lr=cfg.lr)
    store = torch.from_numpy(np.ascontiguousarray(chunks, dtype=np.float32))  # [M, D]
    qs = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))  # [N, D]
    for step in range(cfg.steps):
        batch = rng.choice(train, min(cfg.batch, len(train)), replace=False)  # [B]
        pos = [np.asarray(positives[i], dtype=np.int64) for i in batch]
        sampled = rng.choice(m, min(cfg.negatives, m), replace=False) if m > cfg.negatives else np.arange(m)
        cols = np.unique(np.concatenate([sampled, *pos]))  # [S] candidates, sorted
        rows = np.repeat(np.arange(len(batch)), [len(p) for p in pos])
        mask = torch.zeros(len(batch), len(cols), dtype=torch.bool)  # [B, S] a query's own chunks
        mask[rows, np.searchsorted(cols, np.concatenate(pos))] = True
        q = torch.nn.functional.normalize(qs[batch] @ w.T, dim=1)  # [B, D]
        logits = q @ store[cols].T / cfg.temperature  # [B, S]
        nll = torch.logsumexp(logits, 1) - torch.logsumexp(logits.masked_fill(~mask, float("-inf")), 1)  # [B]
        loss = nll.mean() + cfg.pull * ((w - anchor) ** 2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        report(step + 1, cfg.steps)
    adapter = w.detach().numpy().astype(np.float32)
    held_pos = [positives[i] for i in held]
    before = recall_at(None, queries[held], chunks, held_pos)
    after = recall_at(adapter, queries[held], chunks, held_pos)
    kept = after > before
    metrics |= {"adapter_recall_before": round(before, 4), "adapter_recall_after": round(after, 4), "adapter": kept}
    return (adapter if kept else None), metrics
