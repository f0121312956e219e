"""The gating network: query embedding -> softmax over experts plus "none", temperature-calibrated.

Output classes are positions 0..E-1 for the experts (their ids in `expert_ids`) and E for
"none" (a chunk whose cluster no expert owns). The gate itself (softmax over logits / T and
top-k) always goes through `kernels.gate_topk`.
"""

from __future__ import annotations

import io
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
from kernels import gate_topk

Progress = Callable[[int, int], None]


class GateNet(nn.Module):
    def __init__(self, dim: int, n_classes: int, hidden: int = 256) -> None:
        super().__init__()
        self.dim, self.n_classes, self.hidden = dim, n_classes, hidden
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(0.1), nn.Linear(hidden, n_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # [Q, D] -> [Q, C]


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
    """x [N, D] float32; y [N] class (E = none); calib [N] bool: held out for calibration and metrics."""

    x: npt.NDArray[np.float32]
    y: npt.NDArray[np.int64]
    calib: npt.NDArray[np.bool_]
    n_classes: int


@dataclass
class RouteDecision:
    """One question's gate output: top classes with calibrated probabilities."""

    classes: list[int]  # [K] class positions, best first (E = none)
    probs: list[float]  # [K]
    entropy: float


@dataclass
class Router:
    net: GateNet
    temperature: float
    expert_ids: list[int]  # class position -> expert id
    version_id: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def none_class(self) -> int:
        return len(self.expert_ids)

    def expert_of(self, cls: int) -> int | None:
        return self.expert_ids[cls] if cls < len(self.expert_ids) else None

    def logits(self, q: npt.NDArray[np.float32]) -> torch.Tensor:
        self.net.eval()
        with torch.inference_mode():
            return self.net(torch.from_numpy(np.ascontiguousarray(q, dtype=np.float32)))  # [Q, C]

    def route(self, q: npt.NDArray[np.float32], k: int = 3) -> list[RouteDecision]:
        logits = self.logits(q)  # [Q, C]
        k = min(k, logits.shape[1])
        weights, ids = gate_topk(logits, self.temperature, k)  # [Q, K], [Q, K]
        probs = torch.softmax(logits / self.temperature, dim=-1)  # [Q, C] for the entropy only
        entropy = -(probs * probs.clamp_min(1e-12).log()).sum(-1)  # [Q]
        return [RouteDecision(ids[i].tolist(), weights[i].tolist(), float(entropy[i])) for i in range(len(weights))]

    # ---- persistence ---------------------------------------------------------------------------------

    def state_bytes(self) -> bytes:
        buf = io.BytesIO()
        torch.save(self.net.state_dict(), buf)
        return buf.getvalue()

    @classmethod
    def from_state(
        cls,
        state: bytes,
        *,
        dim: int,
        hidden: int,
        expert_ids: list[int],
        temperature: float,
        version_id: int = 0,
    ) -> Router:
        net = GateNet(dim, len(expert_ids) + 1, hidden)
        net.load_state_dict(torch.load(io.BytesIO(state), weights_only=True))
        net.eval()
        return cls(net, temperature, list(expert_ids), version_id)


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
    with torch.no_grad():  # not inference_mode: the temperature fit needs autograd over these logits
        logits_ho = net(x_ho)  # [H, C]
        train_acc = float((net(x_tr).argmax(-1) == y_tr).float().mean()) if len(y_tr) else 0.0
    temperature = fit_temperature(logits_ho.detach(), y_ho)
    metrics = evaluate(logits_ho, y_ho, temperature, cfg.threshold)
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
