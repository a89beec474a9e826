#!/usr/bin/env bash
# GEMV bandwidth on the GPU at GLM-5's per-rank shapes, against a cudaMemcpy D2D measured in the
# same run (tests/gpu/bench_gemv.c). Needs nvcc and a GPU. Usage: bench/gemv.sh [iters]
set -euo pipefail
cd "$(dirname "$0")/.."
make -s gpu
exec "${BUILD:-build}/gpu/tests/bench_gemv" "$@"
