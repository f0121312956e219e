"""Training the gate: the MLP on chunks and query-like samples, then its evidence weights and
temperature on held-out documents (`engine.router` serves what this fits)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from engine.calibration import (
    coverage_at,
    coverage_curve,
    expected_calibration_error,
    fit_temperature,
    reliability,
)
from engine.router import GateNet, Neighbours

Progress = Callable[[int, int], None]


def without_self(
    scores: npt.NDArray[np.float32], ids: npt.NDArray[np.int64], own: npt.NDArray[np.int64], m: int
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """Search results [Q, M+1] minus each row's own id (own [Q]; -1: none), cut to [Q, M].

    A held-out chunk (or a sample drawn from it) would otherwise find itself: real questions
    find answers, not copies of themselves.
    """
    keep = (ids != own[:, None]) | (own[:, None] < 0)  # [Q, M+1]
    keep[keep.sum(1) > m, -1] = False  # no own id found: drop the last instead
    q = len(ids)
    return scores[keep].reshape(q, -1)[:, :m], ids[keep].reshape(q, -1)[:, :m]


@dataclass
class TrainConfig:
    hidden: int = 256
    epochs: int = 40
    batch_size: int = 512
    lr: float = 3e-3
    weight_decay: float = 1e-4
    threshold: float = 0.7
    seed: int = 0


@dataclass
class TrainingSet:
    """x [N, D] float32; y [N] class (E = none); calib [N] bool: held out for calibration and metrics.

    centroids [L, D] and list_class [L] (the class owning each IVF list) feed the gate's
    retrieval-side evidence; empty arrays train an MLP alone. neighbours: each held-out row's
    nearest chunks (scores, lists) [H, M], itself excluded, found by probing `probe[0]` lists
    for `probe[1]` chunks; None: the gate votes with no neighbours. lexical: each held-out row's
    BM25 best chunks (scores, lists) [H, M'], itself excluded, list -1 in empty slots (a row with
    none, such as a whole chunk, votes with its neighbours alone); None: BM25 has no share.
    """

    x: npt.NDArray[np.float32]
    y: npt.NDArray[np.int64]
    calib: npt.NDArray[np.bool_]
    n_classes: int
    centroids: npt.NDArray[np.float32] = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    list_class: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    neighbours: Neighbours | None = None
    probe: tuple[int, int] = (0, 0)
    lexical: Neighbours | None = None


def class_weights(y: torch.Tensor, n_classes: int) -> torch.Tensor:
    """Inverse square-root frequency: a large expert cannot swallow the rest, a tiny one is not overfit."""
    counts = torch.bincount(y, minlength=n_classes).float()  # [C]
    w = torch.where(counts > 0, counts.clamp_min(1).rsqrt(), torch.zeros_like(counts))
    return w * (w > 0).sum() / w.sum()


def train(
    data: TrainingSet, cfg: TrainConfig, progress: Progress | None = None
) -> tuple[GateNet, float, dict[str, Any]]:
    """Fit the gate on the training part, the temperature on the held-out part; report metrics."""
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    x = torch.from_numpy(data.x)  # [N, D]
    y = torch.from_numpy(data.y)  # [N]
    calib = torch.from_numpy(data.calib)  # [N]
    x_tr, y_tr = x[~calib], y[~calib]
    x_ho, y_ho = x[calib], y[calib]
    net = GateNet(x.shape[1], data.n_classes, cfg.hidden)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.epochs)
    loss_fn = nn.CrossEntropyLoss(weight=class_weights(y_tr, data.n_classes))
    gen = torch.Generator().manual_seed(cfg.seed)
    for epoch in range(cfg.epochs):
        net.train()
        order = torch.randperm(len(y_tr), generator=gen)
        for start in range(0, len(order), cfg.batch_size):
            batch = order[start : start + cfg.batch_size]
            opt.zero_grad()
            loss = loss_fn(net(x_tr[batch]), y_tr[batch])
            loss.backward()
            opt.step()
        sched.step()
        if progress:
            progress(epoch + 1, cfg.epochs + 1)
    net.eval()
    evidence: dict[str, float] = {}
    votes_ho: npt.NDArray[np.float32] | None = None  # [H, C]
    if len(data.list_class):
        net.set_lists(data.centroids, data.list_class)
        if data.neighbours is not None and data.probe[0] > 0:
            net.vote_params[1:3] = torch.tensor(data.probe, dtype=torch.float32)
            if data.lexical is not None:
                net.lexical_params[:2] = torch.tensor([1.0, data.lexical[1].shape[1]])
            votes_ho = net.votes(data.neighbours, data.lexical)  # [H, C]
        evidence = fit_evidence(net, x_ho, y_ho, votes_ho)
    with torch.no_grad():  # not inference_mode: the temperature fit needs autograd over these logits
        logits_ho = net(x_ho, votes_ho)  # [H, C]
        train_acc = float((net(x_tr).argmax(-1) == y_tr).float().mean()) if len(y_tr) else 0.0
    temperature = fit_temperature(logits_ho.detach(), y_ho)
    metrics = evaluate(logits_ho, y_ho, temperature, cfg.threshold)
    metrics.update(evidence)
    metrics.update(
        train_accuracy=train_acc,
        train_size=len(y_tr),
        holdout_size=len(y_ho),
        class_counts=torch.bincount(y, minlength=data.n_classes).tolist(),
        seconds=time.perf_counter() - t0,
    )
    if progress:
        progress(cfg.epochs + 1, cfg.epochs + 1)
    return net, temperature, metrics


def fit_evidence(
    net: GateNet,
    x: torch.Tensor,
    y: torch.Tensor,
    votes: npt.NDArray[np.float32] | None = None,
    sharpness: tuple[float, ...] = (5, 10, 20, 40),
) -> dict[str, float]:
    """Weights (>= 0) of the centroid evidence and the vote, and the former's sharpness, by held-out NLL.

    x [H, D], y [H], votes [H, C] or None. The held-out part is whole documents the MLP never
    trained on, so the weights say how much the retrieval side adds for questions about unseen
    documents. The temperature is free here and fitted again afterwards. Sets
    `net.evidence_params` and the vote weight.
    """
    if len(y) == 0:
        return {}
    with torch.no_grad():
        mlp = net.net(x)  # [H, C]
    nll = nn.CrossEntropyLoss()
    best = (float("inf"), 0.0, 20.0, 0.0)
    for k in sharpness:
        with torch.no_grad():
            features = [mlp, torch.from_numpy(net.evidence(x.numpy(), k))]  # [H, C] each
            features += [torch.from_numpy(votes)] if votes is not None else []
        params = torch.zeros(len(features), requires_grad=True)  # log(1/T), log(w/T)[, log(v/T)]

        def combined(params: torch.Tensor = params, features: list[torch.Tensor] = features) -> torch.Tensor:
            return torch.stack([p.exp() * f for p, f in zip(params, features, strict=True)]).sum(0)

        opt = torch.optim.LBFGS([params], lr=0.1, max_iter=100, line_search_fn="strong_wolfe")

        def closure(opt: Any = opt, combined: Callable[[], torch.Tensor] = combined) -> torch.Tensor:
            opt.zero_grad()
            loss = nll(combined(), y)
            loss.backward()
            return loss

        opt.step(closure)
        with torch.no_grad():
            loss = float(nll(combined(), y))
            w = float((params[1] - params[0]).exp())
            v = float((params[2] - params[0]).exp()) if votes is not None else 0.0
        if loss < best[0] and np.isfinite(w) and np.isfinite(v):
            best = (loss, w, float(k), v)
    with torch.no_grad():
        mlp_only = float(nll(mlp / fit_temperature(mlp, y), y))
    net.evidence_params = torch.tensor([best[1], best[2]])
    net.vote_params[0] = best[3]
    return {
        "evidence_weight": best[1],
        "evidence_sharpness": best[2],
        "vote_weight": best[3],
        "nll_mlp": mlp_only,
        "nll_gate": best[0],
    }


def evaluate(logits: torch.Tensor, labels: torch.Tensor, temperature: float, threshold: float) -> dict[str, Any]:
    """Accuracy, ECE before/after calibration, coverage and accuracy at the threshold, curves."""
    raw = torch.softmax(logits, dim=-1)
    cal = torch.softmax(logits / temperature, dim=-1)
    coverage, acc_at = coverage_at(cal, labels, threshold)
    return {
        "accuracy": float((cal.argmax(-1) == labels).float().mean()) if len(labels) else 0.0,
        "ece_before": expected_calibration_error(raw, labels),
        "ece_after": expected_calibration_error(cal, labels),
        "temperature": temperature,
        "threshold": threshold,
        "coverage_at_threshold": coverage,
        "accuracy_at_threshold": acc_at,
        "reliability": reliability(cal, labels),
        "coverage_curve": coverage_curve(cal, labels),
    }
