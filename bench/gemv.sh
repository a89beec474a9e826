#!/usr/bin/env bash
# GEMV bandwidth on the GPU at GLM-5's per-rank shapes, against a cudaMemcpy D2D measured in the
# same run (tests/gpu/bench_gemv.c), each line with the kernels the launcher picked (tc or simt).
# First runs tests/gpu/test_kernels (TEST=0 skips it) and prints its Q4_K/Q8_0 lines and
# failures, so one device call answers both "correct?" and "how fast?".
# Needs nvcc and a GPU. Usage: [BUILD=build/dev] [TEST=0] bench/gemv.sh [iters]
set -euo pipefail
export G5_NO_DEPS=1  # no network or -dev packages on the GPU machine: no dependency probe
cd "$(dirname "$0")/.."
B=${BUILD:-build}
CC=${CC:-$( [ -x /opt/gcc/bin/gcc ] && echo /opt/gcc/bin/gcc || echo gcc )}
# only the two programs: a half-edited runtime file elsewhere must not stop this benchmark
make -s -j"$(nproc)" CC="$CC" BUILD="$B" EXTRA_CFLAGS="-Wno-error" "$B/gpu/tests/test_kernels" "$B/gpu/tests/bench_gemv"
if [ "${TEST:-1}" = 1 ]; then
  echo "== test_kernels (Q4_K / Q8_0 lines, failures, summary)"
  "$B/gpu/tests/test_kernels" >/tmp/gemv_test_kernels.log 2>&1 || true
  # through a file: `grep | head` under pipefail ends the script when head closes the pipe early
  grep -E "FAIL|passed|Q4_K|Q8_0" /tmp/gemv_test_kernels.log >/tmp/gemv_test_lines.log || true
  head -200 /tmp/gemv_test_lines.log
fi
echo "== bench_gemv"
exec "$B/gpu/tests/bench_gemv" "$@"
