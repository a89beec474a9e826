#!/usr/bin/env bash
# GLM-5 decode step time at one TP 8 rank's shapes (full depth: 78 layers, 256 experts) on one
# GPU, in one device call (issue 6, benchmark 3): build tests/gpu/bench_decode and run its
# --decode mode. The rank is built in memory from synthetic data with the converter's per-rank
# shapes and types (the program's top comment has the method); step time at contexts 1k/8k/32k,
# precise and fast, CUDA graphs off and on, against the bytes each step must read over the HBM
# copy rate measured in the same run. Goal: RATIO <= 1.3 at 1k.
#
#   OUT=/tmp/out bash bench/decode.sh          # on the GPU machine (log: $OUT/decode.log)
#
# Environment: B (build dir, default build/dev), CC (default /opt/gcc/bin/gcc when present),
# DEPS (static xxhash/zstd/pcre2/jansson/microhttpd, default gpu-deps), SKIP_BUILD=1, LAYERS (78),
# CTX (1024,8192,32768), STEPS (20), LIMIT (seconds for the run, default 480), ARGS (more
# bench_decode options, e.g. "--modes fast --graph off", or "--prefill" to run benchmark 4 in
# the same process and save building the model twice).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/g5decode-out}
mkdir -p "$OUT"
source bench/common.sh
SECONDS=0
{
bench_header
bench_build "$OUT/build_decode.log" "$B/gpu/tests/bench_decode" || exit 3
echo "== bench_decode --decode"
timeout "${LIMIT:-480}" "$B/gpu/tests/bench_decode" --decode --layers "${LAYERS:-78}" --ctx "${CTX:-1024,8192,32768}" \
  --steps "${STEPS:-20}" ${ARGS:-}
echo "bench_decode rc=$? ; decode.sh total ${SECONDS}s"
} 2>&1 | tee "$OUT/decode.log"
