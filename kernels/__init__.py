"""Triton kernels with torch twins (the twin is the CPU path and the test oracle). A leaf package."""
