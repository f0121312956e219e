#!/usr/bin/env bash
# GPU-only checks in one short run (a few minutes on a GPU machine): the Triton kernels compiled for
# CUDA against their torch twins, then the kernel table (benchmarks/kernels_gpu.py). Needs only
# torch, Triton, numpy and pytest (no FAISS, FastAPI or SQLAlchemy). Results go to $OUT when set
# (the device tool's folder), else benchmarks/results.
set -euo pipefail
cd "$(dirname "$0")/.."
export TRITON_INTERPRET=0 HF_HUB_OFFLINE=1
if [ -z "${PYTHON:-}" ]; then PYTHON=python3; [ -x .venv/bin/python ] && PYTHON=.venv/bin/python; fi
OUTDIR=${OUT:-benchmarks/results}
# The model where its package is not installed: `python benchmarks/gpu_carry.py` here, carry .gpu-carry.
if [ -z "${MOERAG_MODEL_PATH:-}" ] && [ -d .gpu-carry/model ]; then export MOERAG_MODEL_PATH=$PWD/.gpu-carry/model; fi
mkdir -p "$OUTDIR"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUTDIR/gpu.txt" || true
# --noconftest: the suite's conftest starts the app (FastAPI, SQLAlchemy), which this check does not need.
"$PYTHON" -m pytest -q --noconftest -o addopts= -p no:cacheprovider tests/kernels/test_gpu.py 2>&1 | tee "$OUTDIR/test-gpu.txt"
"$PYTHON" benchmarks/kernels_gpu.py --json "$OUTDIR/kernels-gpu.json" 2>&1 | tee "$OUTDIR/kernels-gpu.log"
