"""Which implementation runs the kernels: chosen once, logged, shown in /readyz.

`auto` picks Triton on a CUDA machine and the torch twins otherwise. Triton is never
launched on a machine with no GPU unless its interpreter is on (TRITON_INTERPRET=1, which
the tests set), because such a launch dies with "0 active drivers".

Under the Triton backend, the data decides each call (`use_triton`): tensors on the GPU go to
the kernel, tensors on the CPU to the torch twin. The served gate's logits come from a NumPy MLP
on the CPU ([1, E] for one question): a launch would first copy them to the GPU and the answer
back, for a softmax over a few dozen numbers, and it raised "Triton kernels need CUDA tensors"
on every routed question of a CUDA machine.
"""

from __future__ import annotations

import logging
import os
from typing import Literal

import torch

log = logging.getLogger(__name__)

Backend = Literal["torch", "triton"]
_chosen: Backend | None = None


def interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def resolve(requested: str = "auto") -> Backend:
    if requested == "torch":
        return "torch"
    if requested == "triton":
        if not triton_available():
            raise RuntimeError("kernel backend 'triton' requested but triton is not installed")
        if not torch.cuda.is_available() and not interpreter_on():
            raise RuntimeError(
                "kernel backend 'triton' needs a CUDA GPU (or TRITON_INTERPRET=1 set before kernels are "
                "imported, for tests); use 'auto' or 'torch' on this machine"
            )
        return "triton"
    if requested != "auto":
        raise ValueError(f"unknown kernel backend {requested!r}; use auto, torch or triton")
    return "triton" if torch.cuda.is_available() and triton_available() else "torch"


def configure(requested: str = "auto") -> Backend:
    """Choose the backend for the process (called once at start-up)."""
    global _chosen
    _chosen = resolve(requested)
    log.info("kernel backend: %s (requested %s)", _chosen, requested)
    return _chosen


def current() -> Backend:
    return _chosen if _chosen is not None else configure("auto")


def use_triton(*tensors: torch.Tensor) -> bool:
    """Whether a call on these tensors runs the Triton kernel: the Triton backend, and the tensors
    on a GPU (or the interpreter on); otherwise its torch twin runs where the data is."""
    return current() == "triton" and (interpreter_on() or all(t.device.type == "cuda" for t in tensors))


def check_launchable(*tensors: torch.Tensor) -> None:
    """Refuse a Triton launch that would reach a GPU driver that is not there."""
    if not interpreter_on() and any(t.device.type != "cuda" for t in tensors):
        raise RuntimeError("Triton kernels need CUDA tensors unless TRITON_INTERPRET=1")
