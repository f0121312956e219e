"""The gating network: query embedding -> softmax over experts plus "none", temperature-calibrated.

Output classes are positions 0..E-1 for the experts (their ids in `expert_ids`) and E for
"none" (a chunk whose cluster no expert owns). The gate itself (softmax over logits / T and
top-k) always goes through `kernels.gate_topk`.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from engine.lexical import LexicalQuery
from index.store import ClusteredIndex
from kernels import gate_topk

VOTE_CHUNKS = 5  # nearest chunks that vote in the gate (5 of the 8 nearest lists: best on dev, of 5/10/20)
LEXICAL_VOTE_CHUNKS = 5  # BM25's best chunks that share the vote, as many as the dense neighbours
Neighbours = tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]  # scores [Q, M], their lists [Q, M] (-1: none)


class GateNet(nn.Module):
    """An MLP over the question embedding, plus two kinds of retrieval-side evidence.

    evidence(q)[c] = (1/k) log sum_{lists l of class c} exp(k q.centroid_l), a soft max of the
    question's similarity to the lists each class owns (-1 for a class without lists); k is the
    sharpness. votes[c] = log share of the vote for class c (`votes`): the question's nearest
    chunks (in its nearest lists, found by the caller with one small IVF probe) vote for the
    class owning their list; when BM25's best chunks over the whole store are given, they hold
    half of the vote. Pooled, not multiplied: a class either side supports stays possible, so a
    rare word ("http.postBuffer") the embedding misses can still speak, and neither side vetoes.
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
        self.lexical_params: torch.Tensor
        # [BM25 shares the vote (1) or not (0), its chunks voting, sharpness on score / best score]
        self.register_buffer("lexical_params", torch.tensor([0.0, float(LEXICAL_VOTE_CHUNKS), 5.0]))

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

    def classes_of(self, lists: torch.Tensor) -> torch.Tensor:
        """[Q, M] list ids (-1: none) -> [Q, M] class positions by the router's own mapping (-1: none)."""
        known = (lists >= 0) & (lists < self.list_class.shape[0])  # [Q, M]
        return torch.where(known, self.list_class[lists.clamp(0, max(self.list_class.shape[0] - 1, 0))], -1)

    def votes(self, neighbours: Neighbours, lexical: Neighbours | None = None) -> torch.Tensor:
        """The nearest chunks' (scores, lists) [Q, M] -> [Q, C] log vote shares by the router's own mapping.

        lexical: BM25's best chunks (scores, lists) [Q, M'], list -1 in empty slots. Where a row
        has any, they hold half of its vote, their scores taken relative to the row's best (BM25
        has no fixed scale); a row without any keeps the dense vote alone.
        """
        scores, lists = (torch.as_tensor(a) for a in neighbours)
        _, _, _, sharpness, alpha = self.vote_params.tolist()
        dense = vote_evidence(scores.float(), self.classes_of(lists), self.n_classes, sharpness, alpha)  # [Q, C]
        if lexical is None:
            return dense
        bm25, hit_lists = (torch.as_tensor(a) for a in lexical)
        classes = self.classes_of(hit_lists)  # [Q, M']
        best = torch.where(classes >= 0, bm25.float(), torch.zeros_like(bm25, dtype=torch.float32)).amax(1)  # [Q]
        relative = torch.where(classes >= 0, bm25.float() / best.clamp_min(1e-9)[:, None], -torch.inf)  # [Q, M']
        lexical_share = vote_evidence(relative, classes, self.n_classes, float(self.lexical_params[2]), alpha)
        pooled = ((dense.exp() + lexical_share.exp()) / 2).log()  # [Q, C]
        return torch.where((classes >= 0).any(1, keepdim=True), pooled, dense)


def bm25_hits(queries: Sequence[LexicalQuery | None], m: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """Each query's m best BM25 chunks as (scores, chunk ids) [Q, m], best first; id -1 in empty
    slots (fewer hits, or no query)."""
    scores = np.zeros((len(queries), m), dtype=np.float32)  # [Q, m]
    ids = np.full((len(queries), m), -1, dtype=np.int64)  # [Q, m]
    for row, query in enumerate(queries):
        hits = query.search(m) if query is not None else []
        ids[row, : len(hits)] = [h for h, _ in hits]
        scores[row, : len(hits)] = [sc for _, sc in hits]
    return scores, ids


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

    @property
    def lexical_chunks(self) -> int:
        """How many of BM25's best chunks share the gate's vote (0: none; the vote is dense alone)."""
        shares, chunks, _ = self.net.lexical_params.tolist()
        return int(chunks) if shares and self.probe_size[0] else 0

    def lexical_probe(self, index: ClusteredIndex, queries: Sequence[LexicalQuery]) -> Neighbours | None:
        """The questions' BM25 best chunks over the whole store, for the vote: (scores, lists) [Q, M],
        list -1 in empty slots and for chunks not in the index yet; None: BM25 has no share."""
        if not self.lexical_chunks:
            return None
        scores, ids = bm25_hits(queries, self.lexical_chunks)  # [Q, M]
        return scores, index.clusters_of(ids)

    def logits(
        self, q: npt.NDArray[np.float32], neighbours: Neighbours | None = None, lexical: Neighbours | None = None
    ) -> torch.Tensor:
        """q [Q, D]; neighbours from `probe` and lexical from `lexical_probe` (None: not searched) -> [Q, C]."""
        with torch.inference_mode():
            votes = self.net.votes(neighbours, lexical) if neighbours is not None else None  # [Q, C]
            return self.net(
                torch.from_numpy(np.array(q, dtype=np.float32)), votes
            )  # [Q, C]; a copy: q may be read-only

    def route(
        self,
        q: npt.NDArray[np.float32],
        k: int = 3,
        neighbours: Neighbours | None = None,
        lexical: Neighbours | None = None,
    ) -> list[RouteDecision]:
        logits = self.logits(q, neighbours, lexical)  # [Q, C]
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
        missing = set(result.missing_keys) - {
            "centroids",
            "list_class",
            "evidence_params",
            "vote_params",
            "lexical_params",
        }
        if missing or result.unexpected_keys:
            raise ValueError(
                f"router state does not fit the gate: missing {sorted(missing)}, "
                f"unexpected {sorted(result.unexpected_keys)}"
            )
        net.eval()
        return cls(net, temperature, list(expert_ids), version_id)
