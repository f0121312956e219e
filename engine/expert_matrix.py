"""Chunk embeddings laid out contiguously by expert, for `kernels.scoped_search`.

On a CUDA machine the expert path scans this GPU-resident copy with the Triton kernel instead of
FAISS (which stays the CPU path). Rows are grouped by expert (CSR offsets), so one expert's
chunks are one contiguous segment.

`auto` never keeps a slower path: under the Triton backend a matrix times the kernel against its
torch twin when it is built (one question on its largest expert, at the served depth, best of a
few runs) and searches with the faster; `kernel` says which and why (/readyz `scoped_kernel`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import torch

from kernels import backend, scoped_search
from kernels.scoped_search import scoped_search_torch, scoped_search_triton

Scoped = Callable[..., tuple[torch.Tensor, torch.Tensor]]


class ExpertMatrix:
    def __init__(
        self,
        ids: npt.NDArray[np.int64],
        vectors: npt.NDArray[np.float32],
        experts: npt.NDArray[np.int64],
        expert_ids: list[int],
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        previous: ExpertMatrix | None = None,
    ) -> None:
        """ids [N], vectors [N, D], experts [N] (an expert id, or -1 for none); expert_ids: the known
        experts; dtype: how the vectors are stored (float16/bfloat16 halve the bytes a search reads);
        previous: the matrix this one replaces, whose measured choice holds while the largest expert
        stays within 2x of the size it was measured at (a state per change does not time again)."""
        self.expert_ids = list(expert_ids)
        position = {e: i for i, e in enumerate(self.expert_ids)}
        pos = np.array([position.get(int(e), -1) for e in experts], dtype=np.int64)  # [N]
        keep = pos >= 0
        order = np.argsort(pos[keep], kind="stable")
        self.ids = torch.from_numpy(ids[keep][order]).to(device)  # [M] chunk id of each row
        self.x = torch.from_numpy(np.ascontiguousarray(vectors[keep][order])).to(device, dtype)  # [M, D]
        counts = np.bincount(pos[keep], minlength=len(self.expert_ids))  # [E]
        self.offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)).to(device)  # [E+1]
        self.device = device
        self._scoped: Scoped = scoped_search
        self.kernel = "by the backend"  # which implementation searches, and why (`choose`)
        self.measured_rows = 0  # the largest expert's rows when the choice was measured
        if backend.use_triton(self.x) and self.x.shape[0]:
            largest = int((self.offsets[1:] - self.offsets[:-1]).max())
            if previous is not None and previous.measured_rows and 0.5 <= largest / previous.measured_rows <= 2:
                self._scoped, self.kernel, self.measured_rows = (
                    previous._scoped,
                    previous.kernel,
                    previous.measured_rows,
                )
            else:
                self.choose()

    def choose(self, depth: int = 50, runs: int = 5) -> str:
        """Time the Triton kernel against its twin on one question over the largest expert and
        search with the faster from now on; -> what was chosen, with both times."""
        sizes = self.offsets[1:] - self.offsets[:-1]  # [E]
        e = int(torch.argmax(sizes))
        start = int(self.offsets[e])
        q = self.x[start : start + 1].float()  # [1, D] a stored row as the question
        sel = torch.tensor([[e]], dtype=torch.int64, device=self.device)  # [1, 1]
        timed = {}
        for name, fn in (("triton", scoped_search_triton), ("torch", scoped_search_torch)):
            best = float("inf")
            for n in range(runs + 1):  # the first run builds the kernel: not counted
                t = time.perf_counter()
                fn(self.x, q, self.offsets, sel, depth)
                if self.device.startswith("cuda"):
                    torch.cuda.synchronize()
                if n:
                    best = min(best, time.perf_counter() - t)
            timed[name] = best * 1000
        chosen = min(timed, key=lambda n: timed[n])
        self._scoped = scoped_search_triton if chosen == "triton" else scoped_search_torch
        self.measured_rows = int(sizes[e])
        others = ", ".join(f"{n} {ms:.3f} ms" for n, ms in timed.items())
        self.kernel = f"{chosen}: measured faster ({others}; one question, {int(sizes[e])} rows, top {depth})"
        return self.kernel

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
        scores, rows = self._scoped(self.x, queries, self.offsets, sel, k)  # [Q, K], [Q, K]
        ids = torch.where(rows >= 0, self.ids[rows.clamp_min(0)], -1)  # [Q, K]
        return scores.cpu().numpy(), ids.cpu().numpy()
