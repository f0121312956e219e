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
from index.store import ClusteredIndex
from kernels import gate_topk

Progress = Callable[[int, int], None]
VOTE_CHUNKS = 5  # nearest chunks that vote in the gate (5 of the 8 nearest lists: best on dev, of 5/10/20)
Neighbours = tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]  # scores [Q, M], their lists [Q, M] (-1: none)


class GateNet(nn.Module):
    """An MLP over the question embedding, plus two kinds of retrieval-side evidence.

    evidence(q)[c] = (1/k) log sum_{lists l of class c} exp(k q.centroid_l), a soft max of the
    question's similarity to the lists each class owns (-1 for a class without lists); k is the
    sharpness. votes[c] = log share of the question's nearest chunks (in its nearest lists) that
    lie in class c's lists (`vote_evidence`), found by the caller with one small IVF probe.
    logits = mlp(q) + w * evidence(q) + v * votes, with w, k and v fitted on held-out documents.
    The centroids and their classes are the router's own copy, taken when it was trained, so a
    router never mixes with a mapping it was not trained for.
    """

    def __init__(self, dim: int, n_classes: int, hidden: int = 256, n_lists: int = 0) -> None:
        super().__init__()
        self.dim, self.n_classes, self.hidden = dim, n_classes, hidden
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(0.1), nn.Linear(hidden, n_classes))
        self.centroids: torch.Tensor
        self.list_class: torch.Tensor
        self.evidence_params: torch.Tensor
        self.register_buffer("centroids", torch.zeros(n_lists, dim))  # [L, D]
        self.register_buffer("list_class", torch.zeros(n_lists, dtype=torch.long))  # [L]
        self.register_buffer("evidence_params", torch.tensor([0.0, 20.0]))  # [weight w, sharpness k]
        self.vote_params: torch.Tensor
        # [weight v, lists probed, chunks voting, sharpness, smoothing]; v = 0: no probe.
        self.register_buffer("vote_params", torch.tensor([0.0, 0.0, float(VOTE_CHUNKS), 20.0, 0.01]))

    def forward(self, x: torch.Tensor, votes: torch.Tensor | None = None) -> torch.Tensor:
        """x [Q, D], votes [Q, C] (`vote_evidence`; None: no probe was made) -> logits [Q, C]."""
        logits = self.net(x)  # [Q, D] -> [Q, C]
        w, v = float(self.evidence_params[0]), float(self.vote_params[0])
        if w != 0.0 and self.centroids.shape[0] > 0:
            logits = logits + w * self.evidence(x)
        if v != 0.0 and votes is not None:
            logits = logits + v * votes
        return logits

    def evidence(self, x: torch.Tensor, sharpness: float | None = None) -> torch.Tensor:
        """[Q, D] -> [Q, C] soft max of q.centroid over each class's lists (-1 where a class has none)."""
        k = float(self.evidence_params[1]) if sharpness is None else sharpness
        sims = x @ self.centroids.T  # [Q, L], <= 1 for unit vectors
        mass = torch.zeros(x.shape[0], self.n_classes, dtype=sims.dtype)  # [Q, C]
        mass.index_add_(1, self.list_class, torch.exp(k * (sims - 1)))  # shifted: no overflow
        return torch.where(mass > 0, mass.clamp_min(1e-30).log() / k + 1, torch.full_like(mass, -1.0))

    def set_lists(self, centroids: npt.NDArray[np.float32], list_class: npt.NDArray[np.int64]) -> None:
        self.centroids = torch.tensor(centroids, dtype=torch.float32)  # a copy: SQL rows are read-only
        self.list_class = torch.tensor(list_class, dtype=torch.long)

    def votes(self, neighbours: Neighbours) -> torch.Tensor:
        """The nearest chunks' (scores, lists) [Q, M] -> [Q, C] log vote shares by the router's own mapping."""
        scores, lists = (torch.as_tensor(a) for a in neighbours)
        known = (lists >= 0) & (lists < self.list_class.shape[0])  # [Q, M]
        classes = torch.where(known, self.list_class[lists.clamp(0, max(self.list_class.shape[0] - 1, 0))], -1)
        _, _, _, sharpness, alpha = self.vote_params.tolist()
        return vote_evidence(scores.float(), classes, self.n_classes, sharpness, alpha)


def vote_evidence(
    scores: torch.Tensor, classes: torch.Tensor, n_classes: int, sharpness: float, alpha: float
) -> torch.Tensor:
    """Nearest chunks vote for their class: scores [Q, M] and classes [Q, M] (-1: empty slot) -> [Q, C].

    share[c] = (sum_{hits h of class c} exp(k (s_h - s_best)) + alpha) / (sum_h exp(k (s_h - s_best)) + C alpha);
    returns log share. A near tie splits the vote; alpha keeps every class possible; a question
    with no hits gets a uniform row (which the softmax ignores). Ties need no rule: a sum.
    """
    valid = (classes >= 0) & torch.isfinite(scores)  # [Q, M]
    best = torch.where(valid, scores, torch.full_like(scores, -torch.inf)).amax(1, keepdim=True)  # [Q, 1]
    best = torch.where(torch.isfinite(best), best, torch.zeros_like(best))
    weight = torch.where(valid, torch.exp(sharpness * (scores - best).clamp_max(0)), torch.zeros_like(scores))
    mass = torch.zeros(scores.shape[0], n_classes, dtype=scores.dtype)  # [Q, C]
    mass.scatter_add_(1, classes.clamp_min(0), weight)
    return ((mass + alpha) / (mass.sum(1, keepdim=True) + n_classes * alpha)).log()


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
    for `probe[1]` chunks; None: the gate votes with no neighbours.
    """

    x: npt.NDArray[np.float32]
    y: npt.NDArray[np.int64]
    calib: npt.NDArray[np.bool_]
    n_classes: int
    centroids: npt.NDArray[np.float32] = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    list_class: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    neighbours: Neighbours | None = None
    probe: tuple[int, int] = (0, 0)


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

    def __post_init__(self) -> None:
        self.net.eval()  # once, not per question: the switch walks every module

    @property
    def none_class(self) -> int:
        return len(self.expert_ids)

    def expert_of(self, cls: int) -> int | None:
        return self.expert_ids[cls] if cls < len(self.expert_ids) else None

    @property
    def probe_size(self) -> tuple[int, int]:
        """(lists probed, chunks voting) for the gate's vote; (0, 0): the gate needs no probe."""
        v, lists, chunks, _, _ = self.net.vote_params.tolist()
        return (int(lists), int(chunks)) if v != 0.0 and lists > 0 else (0, 0)

    def probe(self, index: ClusteredIndex, q: npt.NDArray[np.float32]) -> tuple[Neighbours | None, int]:
        """The question's nearest chunks in its nearest lists, for the vote: (neighbours, vectors scanned)."""
        lists, chunks = self.probe_size
        if not lists or index.ntotal == 0:
            return None, 0
        scores, ids, scanned = index.search_nearest(q, chunks, lists)  # [Q, M]
        return (scores, index.clusters_of(ids)), scanned

    def logits(self, q: npt.NDArray[np.float32], neighbours: Neighbours | None = None) -> torch.Tensor:
        with torch.inference_mode():
            votes = self.net.votes(neighbours) if neighbours is not None else None  # [Q, C]
            return self.net(
                torch.from_numpy(np.array(q, dtype=np.float32)), votes
            )  # [Q, C]; a copy: q may be read-only

    def route(
        self, q: npt.NDArray[np.float32], k: int = 3, neighbours: Neighbours | None = None
    ) -> list[RouteDecision]:
        logits = self.logits(q, neighbours)  # [Q, C]
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
        weights = torch.load(io.BytesIO(state), weights_only=True)
        n_lists = int(weights["centroids"].shape[0]) if "centroids" in weights else 0
        net = GateNet(dim, len(expert_ids) + 1, hidden, n_lists)
        # Versions trained before an evidence term lack its buffers: that term's weight stays 0.
        result = net.load_state_dict(weights, strict=False)
        missing = set(result.missing_keys) - {"centroids", "list_class", "evidence_params", "vote_params"}
        if missing or result.unexpected_keys:
            raise ValueError(
                f"router state does not fit the gate: missing {sorted(missing)}, "
                f"unexpected {sorted(result.unexpected_keys)}"
            )
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
    evidence: dict[str, float] = {}
    votes_ho: torch.Tensor | None = None
    if len(data.list_class):
        net.set_lists(data.centroids, data.list_class)
        if data.neighbours is not None and data.probe[0] > 0:
            net.vote_params[1:3] = torch.tensor(data.probe, dtype=torch.float32)
            votes_ho = net.votes(data.neighbours)  # [H, C]
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
    votes: torch.Tensor | None = None,
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
            features = [mlp, net.evidence(x, k)] + ([votes] if votes is not None else [])  # [H, C] each
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
