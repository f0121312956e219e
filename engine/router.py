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
from scipy.special import erf
from torch import nn

from engine.adapter import adapt
from engine.lexical import BestChunks
from index.store import SearchIndex
from kernels import gate_topk

VOTE_CHUNKS = 5  # nearest chunks that vote in the gate (5 of the 8 nearest lists: best on dev, of 5/10/20)
LEXICAL_VOTE_CHUNKS = 5  # BM25's best chunks that share the vote, as many as the dense neighbours
ADAPTER_KEY = "query_adapter"  # the query adapter's [D, D] in a version's stored state
SQRT_HALF = 0.7071067811865476  # GELU(x) = x/2 (1 + erf(x / sqrt 2))
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

    def forward(self, x: torch.Tensor, votes: npt.ArrayLike | None = None) -> torch.Tensor:
        """x [Q, D], votes [Q, C] (`votes`; None: no probe was made) -> logits [Q, C].

        The MLP runs in torch (it is what training fits); the retrieval-side terms are NumPy over
        the arrays the probes return, as FAISS's and BM25's results are: for one question each
        small torch op cost several NumPy ones (`Router.route`, one question: 1.1-1.4 -> 0.8 ms).
        A served router reads the same sum through `FrozenMlp` (`Router.logits`).
        """
        logits = self.net(x)  # [Q, D] -> [Q, C]
        extra = self.retrieval_terms(x.detach().numpy(), votes)  # [Q, C] or None
        return logits if extra is None else logits + torch.from_numpy(extra)

    def retrieval_terms(
        self, x: npt.NDArray[np.float32], votes: npt.ArrayLike | None
    ) -> npt.NDArray[np.float32] | None:
        """x [Q, D], votes [Q, C] or None -> [Q, C] w * evidence(x) + v * votes; None: both weights 0."""
        w, v = float(self.evidence_params[0]), float(self.vote_params[0])
        extra: npt.NDArray[np.float32] | None = None  # [Q, C]
        if w != 0.0 and self.centroids.shape[0] > 0:
            extra = w * self.evidence(x)
        if v != 0.0 and votes is not None:
            extra = v * np.asarray(votes, dtype=np.float32) + (0.0 if extra is None else extra)
        return None if extra is None else np.asarray(extra, dtype=np.float32)

    def evidence(self, x: npt.ArrayLike, sharpness: float | None = None) -> npt.NDArray[np.float32]:
        """[Q, D] -> [Q, C] soft max of q.centroid over each class's lists (-1 where a class has none)."""
        k = float(self.evidence_params[1]) if sharpness is None else sharpness
        sims = np.asarray(x, dtype=np.float32) @ self.centroids.numpy().T  # [Q, L], <= 1 for unit vectors
        one_hot = _one_hot(self.list_class.numpy(), self.n_classes)  # [L, C]
        mass = np.exp(k * (sims - 1)) @ one_hot  # [Q, C], shifted: no overflow
        return np.where(mass > 0, np.log(np.maximum(mass, 1e-30)) / k + 1, -1.0).astype(np.float32, copy=False)

    def set_lists(self, centroids: npt.NDArray[np.float32], list_class: npt.NDArray[np.int64]) -> None:
        self.centroids = torch.tensor(centroids, dtype=torch.float32)  # a copy: SQL rows are read-only
        self.list_class = torch.tensor(list_class, dtype=torch.long)

    def classes_of(self, lists: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """[Q, M] list ids (-1: none) -> [Q, M] class positions by the router's own mapping (-1: none)."""
        list_class = self.list_class.numpy()  # [L]
        n = list_class.shape[0]
        # any negative id and lists beyond the router's own (a newer index) land on the trailing -1
        return np.append(list_class, -1)[np.clip(np.asarray(lists, dtype=np.int64), -1, n)]

    def votes(self, neighbours: Neighbours, lexical: Neighbours | None = None) -> npt.NDArray[np.float32]:
        """The nearest chunks' (scores, lists) [Q, M] -> [Q, C] log vote shares by the router's own mapping.

        lexical: BM25's best chunks (scores, lists) [Q, M'], list -1 in empty slots. Where a row
        has any, they hold half of its vote, their scores taken relative to the row's best (BM25
        has no fixed scale); a row without any keeps the dense vote alone.
        """
        scores, lists = neighbours
        _, _, _, sharpness, alpha = self.vote_params.tolist()
        dense = vote_evidence(scores, self.classes_of(lists), self.n_classes, sharpness, alpha)  # [Q, C]
        if lexical is None:
            return dense
        bm25 = np.asarray(lexical[0], dtype=np.float32)
        classes = self.classes_of(lexical[1])  # [Q, M']
        hit = classes >= 0  # [Q, M']
        best = np.where(hit, bm25, 0.0).max(1, keepdims=True)  # [Q, 1]
        relative = bm25 / np.maximum(best, 1e-9)  # [Q, M']; slots without a class do not vote
        lexical_share = vote_evidence(relative, classes, self.n_classes, float(self.lexical_params[2]), alpha)
        pooled = np.logaddexp(dense, lexical_share) - np.log(2.0)  # [Q, C] log of the mean share
        return np.where(hit.any(1, keepdims=True), pooled, dense).astype(np.float32, copy=False)


def _one_hot(classes: npt.NDArray[np.int64], n_classes: int) -> npt.NDArray[np.float32]:
    """[N] class positions (-1: none) -> [N, C] float32 rows (all zero for -1)."""
    return (classes[:, None] == np.arange(n_classes)).astype(np.float32)


@dataclass(frozen=True)
class FrozenMlp:
    """The gate's trained MLP as NumPy arrays, for serving (its torch twin is `GateNet.net`, in eval mode).

    Linear [D -> H], exact GELU (erf, as `nn.GELU()`), dropout off, Linear [H -> C]. One question
    through torch's module calls cost ~85 us, through these arrays ~18 us; the logits agree to
    float32 rounding (a test holds them to 1e-5).
    """

    w1: npt.NDArray[np.float32]  # [H, D]
    b1: npt.NDArray[np.float32]  # [H]
    w2: npt.NDArray[np.float32]  # [C, H]
    b2: npt.NDArray[np.float32]  # [C]

    @classmethod
    def of(cls, mlp: nn.Sequential) -> FrozenMlp:
        first, act, *dropout, last = mlp
        if not (
            isinstance(first, nn.Linear)
            and isinstance(act, nn.GELU)
            and act.approximate == "none"
            and all(isinstance(d, nn.Dropout) for d in dropout)
            and len(dropout) <= 1
            and isinstance(last, nn.Linear)
        ):
            raise TypeError(f"FrozenMlp serves Linear, the exact GELU, [Dropout,] Linear; got {mlp}")
        arrays = (first.weight, first.bias, last.weight, last.bias)
        return cls(*(a.detach().numpy().copy() for a in arrays))  # copies: later training cannot reach them

    def __call__(self, x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        h = x @ self.w1.T + self.b1  # [Q, D] -> [Q, H]
        h = 0.5 * h * (1.0 + erf(h * np.float32(SQRT_HALF)))  # exact GELU
        return np.asarray(h @ self.w2.T + self.b2, dtype=np.float32)  # [Q, C]


def bm25_hits(queries: Sequence[BestChunks | None], m: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
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
    scores: npt.ArrayLike, classes: npt.ArrayLike, n_classes: int, sharpness: float, alpha: float
) -> npt.NDArray[np.float32]:
    """Nearest chunks vote for their class: scores [Q, M] and classes [Q, M] (-1: empty slot) -> [Q, C].

    share[c] = (sum_{hits h of class c} exp(k (s_h - s_best)) + alpha) / (sum_h exp(k (s_h - s_best)) + C alpha);
    returns log share. A near tie splits the vote; alpha keeps every class possible; a question
    with no hits gets a uniform row (which the softmax ignores). Ties need no rule: a sum.
    sharpness > 0 (an empty slot's weight is exp(-inf) = 0).
    """
    classes = np.asarray(classes, dtype=np.int64)
    scores = np.asarray(scores, dtype=np.float32)
    scores = np.where((classes >= 0) & np.isfinite(scores), scores, -np.inf)  # [Q, M], -inf: no vote
    best = scores.max(1, keepdims=True, initial=-np.inf)  # [Q, 1]
    best[best == -np.inf] = 0.0  # a row without hits: every weight is exp(-inf) = 0
    weight = np.exp(sharpness * (scores - best))  # [Q, M] in [0, 1]
    mass = np.einsum("qm,qmc->qc", weight, classes[:, :, None] == np.arange(n_classes))  # [Q, C]; -1: no class
    return np.log((mass + alpha) / (mass.sum(1, keepdims=True) + n_classes * alpha)).astype(np.float32, copy=False)


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
    adapter: npt.NDArray[np.float32] | None = None  # [D, D] the query adapter trained with it (engine.adapter)
    mlp: FrozenMlp = field(init=False, repr=False)  # the net's MLP, frozen for serving

    def __post_init__(self) -> None:
        self.net.eval()  # once, not per question: the switch walks every module
        self.mlp = FrozenMlp.of(self.net.net)  # a router serves one trained version: its weights, frozen

    def retrieval_vector(self, q: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """q [Q, D] -> [Q, D] the question as retrieval sees it: through this version's query adapter
        when it has one. The gate itself reads q as it came from the model."""
        return adapt(self.adapter, q)

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

    def probe(self, index: SearchIndex, q: npt.NDArray[np.float32]) -> tuple[Neighbours | None, int]:
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

    def lexical_probe(self, index: SearchIndex, queries: Sequence[BestChunks | None]) -> Neighbours | None:
        """The questions' BM25 best chunks over the whole store, for the vote: (scores, lists) [Q, M],
        list -1 in empty slots and for chunks not in the index yet; None: BM25 has no share."""
        if not self.lexical_chunks:
            return None
        scores, ids = bm25_hits(queries, self.lexical_chunks)  # [Q, M]
        return scores, index.clusters_of(ids)

    def logits(
        self, q: npt.NDArray[np.float32], neighbours: Neighbours | None = None, lexical: Neighbours | None = None
    ) -> torch.Tensor:
        """q [Q, D]; neighbours from `probe` and lexical from `lexical_probe` (None: not searched) -> [Q, C].

        `GateNet.forward`'s sum, in NumPy: the frozen MLP plus the retrieval-side terms.
        """
        x = np.asarray(q, dtype=np.float32)  # [Q, D]
        votes = self.net.votes(neighbours, lexical) if neighbours is not None else None  # [Q, C]
        logits = self.mlp(x)  # [Q, C]
        extra = self.net.retrieval_terms(x, votes)  # [Q, C] or None
        if extra is not None:
            logits += extra
        return torch.from_numpy(logits)

    def served_logits(
        self, index: SearchIndex, q: npt.NDArray[np.float32], queries: Sequence[BestChunks | None] | None
    ) -> torch.Tensor:
        """q [Q, D] and each question's BM25 query (None: no BM25 index) -> [Q, C] as `/ask`'s gate
        computes them: with its IVF probe's vote and BM25's share of it, for evaluating on labelled questions."""
        neighbours, _ = self.probe(index, q)
        lexical = self.lexical_probe(index, queries) if queries is not None else None
        return self.logits(q, neighbours, lexical)

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
        z = logits.numpy() / self.temperature  # [Q, C]; the entropy only, in NumPy (cheaper for one row)
        probs = np.exp(z - z.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        entropy = -(probs * np.log(np.maximum(probs, 1e-12))).sum(-1)  # [Q]
        return [RouteDecision(c, w, float(h)) for c, w, h in zip(ids.tolist(), weights.tolist(), entropy, strict=True)]

    # ---- persistence ---------------------------------------------------------------------------------

    def state_bytes(self) -> bytes:
        state = dict(self.net.state_dict())
        if self.adapter is not None:
            state[ADAPTER_KEY] = torch.from_numpy(self.adapter)
        buf = io.BytesIO()
        torch.save(state, buf)
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
        adapter = weights.pop(ADAPTER_KEY, None)  # versions trained before the adapter have none
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
        return cls(
            net, temperature, list(expert_ids), version_id, adapter=adapter.numpy() if adapter is not None else None
        )
