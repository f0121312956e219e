"""Triton kernels with torch twins (the twin is the CPU path and the test oracle). A leaf package.

Set TRITON_INTERPRET=1 before importing this package to run the Triton versions on a CPU.
"""

from kernels.backend import configure, current
from kernels.gate_topk import gate_topk
from kernels.scoped_search import scoped_search

__all__ = ["configure", "current", "gate_topk", "scoped_search"]
