"""Chunk embeddings laid out contiguously by expert, for `kernels.scoped_search`.

On a CUDA machine the expert path scans this GPU-resident copy with the Triton kernel instead of
FAISS (which stays the CPU path). Rows are grouped by expert (CSR offsets), so one expert's
chunks are one contiguous segment.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from kernels import scoped_search


class ExpertMatrix:
    def __init__(
        self,
        ids: npt.NDArray[np.int64],
        vectors: npt.NDArray[np.float32],
        experts: npt.NDArray[np.int64],
        expert_ids: list[int],
        device: str = "cpu",
    ) -> None:
        """ids [N], vectors [N, D], experts [N] (an expert id, or -1 for none); expert_ids: the known experts."""
        self.expert_ids = list(expert_ids)
        position = {e: i for i, e in enumerate(self.expert_ids)}
        pos = np.array([position.get(int(e), -1) for e in experts], dtype=np.int64)  # [N]
        keep = pos >= 0
        order = np.argsort(pos[keep], kind="stable")
        self.ids = torch.from_numpy(ids[keep][order]).to(device)  # [M] chunk id of each row
        self.x = torch.from_numpy(np.ascontiguousarray(vectors[keep][order])).to(device)  # [M, D]
        counts = np.bincount(pos[keep], minlength=len(self.expert_ids))  # [E]
        self.offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)).to(device)  # [E+1]
        self.device = device

    def sizes(self, expert_ids: list[int]) -> int:
        bounds = self.offsets.tolist()
        return sum(bounds[i + 1] - bounds[i] for i in (self._position(e) for e in expert_ids) if i >= 0)

    def _position(self, expert_id: int) -> int:
        try:
            return self.expert_ids.index(expert_id)
        except ValueError:
            return -1

    def search(self, q: npt.NDArray[np.float32], expert_ids: list[int], k: int) -> tuple[np.ndarray, np.ndarray]:
        """q [Q, D] -> (scores [Q, K], chunk ids [Q, K]) over the given experts' rows; -1 pads."""
        if self.ids.numel() == 0:  # no chunk belongs to any expert yet
            return np.full((len(q), k), -np.inf, dtype=np.float32), np.full((len(q), k), -1, dtype=np.int64)
        positions = [p for p in (self._position(e) for e in expert_ids) if p >= 0] or [-1]
        sel = torch.tensor([positions] * len(q), dtype=torch.int64, device=self.device)  # [Q, S]
        queries = torch.tensor(
            np.asarray(q, dtype=np.float32), device=self.device
        )  # [Q, D], a copy (q may be read-only)
        scores, rows = scoped_search(self.x, queries, self.offsets, sel, k)  # [Q, K], [Q, K]
        ids = torch.where(rows >= 0, self.ids[rows.clamp_min(0)], -1)  # [Q, K]
        return scores.cpu().numpy(), ids.cpu().numpy()
