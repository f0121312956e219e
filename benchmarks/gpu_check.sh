#!/usr/bin/env bash
# GPU-only checks in one short run (a few minutes on a GPU machine): the Triton kernels compiled for
# CUDA against their torch twins, the ask pipeline on the GPU against the CPU service's answers
# (benchmarks/gpu_pipeline.py), then the kernel table (benchmarks/kernels_gpu.py). Needs torch,
# Triton, numpy, scipy and pytest there, and what `python benchmarks/gpu_carry.py` puts in
# .gpu-carry here (the model, the wheels FAISS and BM25 need, the pipeline's store); no FastAPI or
# SQLAlchemy. Results go to $OUT when set (the device tool's folder), else benchmarks/results.
set -euo pipefail
cd "$(dirname "$0")/.."
export TRITON_INTERPRET=0 HF_HUB_OFFLINE=1
if [ -z "${PYTHON:-}" ]; then PYTHON=python3; [ -x .venv/bin/python ] && PYTHON=.venv/bin/python; fi
OUTDIR=${OUT:-benchmarks/results}
# The model where its package is not installed: `python benchmarks/gpu_carry.py` here, carry .gpu-carry.
if [ -z "${MOERAG_MODEL_PATH:-}" ] && [ -d .gpu-carry/model ]; then export MOERAG_MODEL_PATH=$PWD/.gpu-carry/model; fi
# The carried wheels (faiss-cpu, bm25s, httpx), unpacked onto the path.
if [ -f .gpu-carry/site.tar.xz ]; then
  SITE=${TMPDIR:-/tmp}/moerag-gpu-site; mkdir -p "$SITE"; tar -xJf .gpu-carry/site.tar.xz -C "$SITE"
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
mkdir -p "$OUTDIR"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUTDIR/gpu.txt" || true
# --noconftest: the suite's conftest starts the app (FastAPI, SQLAlchemy), which this check does not need.
"$PYTHON" -m pytest -q --noconftest -o addopts= -p no:cacheprovider tests/kernels/test_gpu.py 2>&1 | tee "$OUTDIR/test-gpu.txt" || true
if [ -d .gpu-carry/pipeline ]; then
  "$PYTHON" benchmarks/gpu_pipeline.py check --json "$OUTDIR/pipeline-gpu.json" 2>&1 | tee "$OUTDIR/pipeline-gpu.log" || true
fi
"$PYTHON" benchmarks/kernels_gpu.py --json "$OUTDIR/kernels-gpu.json" 2>&1 | tee "$OUTDIR/kernels-gpu.log"
