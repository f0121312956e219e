"""Temperature scaling and the reliability metrics reported with every router version."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch

ECE_BINS = 15


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor, max_iter: int = 200) -> float:
    """The T > 0 minimising NLL of softmax(logits / T) on held-out data. logits [N, C], labels [N]."""
    if len(labels) == 0:
        return 1.0
    log_t = torch.zeros(1, requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=0.1, max_iter=max_iter, line_search_fn="strong_wolfe")
    nll = torch.nn.CrossEntropyLoss()

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = nll(logits / log_t.exp(), labels)
        loss.backward()
        return loss

    opt.step(closure)
    t = float(log_t.exp().item())
    return t if math.isfinite(t) and t > 0 else 1.0


def expected_calibration_error(probs: torch.Tensor, labels: torch.Tensor, bins: int = ECE_BINS) -> float:
    """ECE with equal-width confidence bins. probs [N, C], labels [N]."""
    conf, pred = probs.max(dim=1)  # [N], [N]
    return confidence_ece(conf, (pred == labels).float(), bins)


def confidence_ece(conf: torch.Tensor, correct: torch.Tensor, bins: int = ECE_BINS) -> float:
    """ECE of stated confidences conf [N] against outcomes correct [N] (1.0 right, 0.0 wrong)."""
    if len(conf) == 0:
        return 0.0
    edges = torch.linspace(0, 1, bins + 1)
    ece = torch.zeros(())
    for lo, hi in itertools.pairwise(edges):
        in_bin = (conf > lo) & (conf <= hi) if lo > 0 else (conf >= lo) & (conf <= hi)
        if in_bin.any():
            ece += in_bin.float().mean() * (conf[in_bin].mean() - correct[in_bin].mean()).abs()
    return float(ece)


def ece_noise_floor(conf: torch.Tensor, rounds: int = 2000, seed: int = 0) -> dict[str, float]:
    """ECE that a perfectly calibrated model with these confidences conf [N] would show on N questions.

    Outcomes are drawn right with probability conf; the mean and 95th percentile of their ECE
    say how small an ECE this many questions can show at all (with 174 questions and the
    router's confidences, about 0.05: a measured ECE near it is noise, not miscalibration).
    """
    if len(conf) == 0:
        return {"mean": 0.0, "p95": 0.0}
    g = torch.Generator().manual_seed(seed)
    draws = torch.tensor(
        [confidence_ece(conf, (torch.rand(len(conf), generator=g) < conf).float()) for _ in range(rounds)]
    )  # [rounds]
    return {"mean": float(draws.mean()), "p95": float(torch.quantile(draws, 0.95))}


def lowest_ece_by_temperature(
    logits: torch.Tensor, labels: torch.Tensor, temperatures: Sequence[float] | None = None
) -> dict[str, float]:
    """The lowest ECE any single temperature reaches on logits [N, C] against labels [N], and that T.

    A diagnostic bound, never a fit to serve: the temperature is chosen on the very rows it is
    scored on. When even this is above an ECE aim, no temperature fitted elsewhere can meet the
    aim on these rows; the gate itself must be sharper where it is right.
    Grid: 41 temperatures spaced evenly in log T over [0.5, 20] unless given; ties: the first in
    the grid (the lower T, for the default one).
    """
    grid = temperatures if temperatures is not None else torch.logspace(math.log10(0.5), math.log10(20), 41).tolist()
    best = (float("inf"), 1.0)
    for t in grid:
        ece = expected_calibration_error(torch.softmax(logits / t, dim=-1), labels)
        if ece < best[0]:
            best = (ece, float(t))
    return {"ece": best[0], "temperature": best[1]}


def reliability(probs: torch.Tensor, labels: torch.Tensor, bins: int = ECE_BINS) -> list[dict[str, float]]:
    """Per-bin confidence, accuracy and count, for the console's reliability diagram."""
    conf, pred = probs.max(dim=1)
    correct = (pred == labels).float()
    edges = torch.linspace(0, 1, bins + 1)
    out = []
    for lo, hi in itertools.pairwise(edges):
        in_bin = (conf > lo) & (conf <= hi)
        n = int(in_bin.sum())
        out.append(
            {
                "lo": float(lo),
                "hi": float(hi),
                "count": n,
                "confidence": float(conf[in_bin].mean()) if n else 0.0,
                "accuracy": float(correct[in_bin].mean()) if n else 0.0,
            }
        )
    return out


def coverage_at(probs: torch.Tensor, labels: torch.Tensor, threshold: float) -> tuple[float, float]:
    """(share of samples with confidence >= threshold, accuracy among them)."""
    if len(labels) == 0:
        return 0.0, 0.0
    conf, pred = probs.max(dim=1)
    kept = conf >= threshold
    if not kept.any():
        return 0.0, 0.0
    return float(kept.float().mean()), float((pred[kept] == labels[kept]).float().mean())


def coverage_curve(probs: torch.Tensor, labels: torch.Tensor, steps: int = 21) -> list[dict[str, float]]:
    out = []
    for i in range(steps):
        t = i / (steps - 1)
        cov, acc = coverage_at(probs, labels, t)
        out.append({"threshold": t, "coverage": cov, "accuracy": acc})
    return out
