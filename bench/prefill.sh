#!/usr/bin/env bash
# GLM-5 prefill of a 4096-token prompt at one TP 8 rank's shapes on one GPU, in one device call
# (issue 6, benchmark 4): build tests/gpu/bench_decode and run its --prefill mode: tokens/s for
# each product path (the prefill GEMM path with f16, f32 compute, and the GEMV kernels),
# the stage split, and the weight-product FLOP rate against cuBLAS bf16 GEMMs of the same shapes
# measured in the same run (the matrix-unit utilization).
#
#   OUT=/tmp/out bash bench/prefill.sh         # on the GPU machine (log: $OUT/prefill.log)
#
# Environment: as bench/decode.sh (B, CC, DEPS, SKIP_BUILD, LIMIT, ARGS), plus LAYERS (default 78;
# fewer are scaled to 78 by the stage split and say so), TOKENS (4096), GEMM (the variants,
# default f16,f32,gemv; "default" = the mode's own), CAP (seconds per variant
# before the rest is extrapolated, default 30).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/g5prefill-out}
mkdir -p "$OUT"
source bench/common.sh
SECONDS=0
{
bench_header
bench_build "$OUT/build_prefill.log" "$B/gpu/tests/bench_decode" || exit 3
echo "== bench_decode --prefill"
timeout "${LIMIT:-480}" "$B/gpu/tests/bench_decode" --prefill --layers "${LAYERS:-78}" \
  --prefill-tokens "${TOKENS:-4096}" --gemm "${GEMM:-f16,f32,gemv}" --prefill-cap "${CAP:-30}" ${ARGS:-}
echo "bench_decode rc=$? ; prefill.sh total ${SECONDS}s"
} 2>&1 | tee "$OUT/prefill.log"
