#!/usr/bin/env bash
# GPU-only checks in one short run (< 5 minutes on a GPU machine): the Triton kernels compiled
# for CUDA against their torch twins, then the kernel benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
export TRITON_INTERPRET=0 HF_HUB_OFFLINE=1
PY=${PYTHON:-.venv/bin/python}
$PY -m pytest -q tests/kernels/test_gpu.py
mkdir -p benchmarks/results
$PY benchmarks/kernels.py --gpu --sizes 10000 100000 1000000 --repeat 10 --json benchmarks/results/kernels-gpu.json
