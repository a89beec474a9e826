#!/usr/bin/env bash
# One call on the GPU machine: build the GPU tree, then `make test-gpu` (every GPU test program and
# tests/gpu/oracle_cli.sh: glm5-run --device cuda against the oracle, every comparison an
# assertion; `N passed, N failed` last), then the converter benchmark (bench/convert.sh, TP=8, on
# the device's disk; CONVERT_BENCH=0 skips it, EXPERTS=64 makes it smaller, BENCH_LIMIT caps it in
# seconds). Exits non-zero when the build or any GPU test fails. Everything goes to $OUT (log,
# build.log, test-gpu.log, test-gpu-detail.log, oracle_cli/, convert_bench.log).
#
#   GLM5_SHARED=... OUT=... bash tests/gpu/run_device.sh
#
# Expects gpu-deps/ (scripts/gpu-deps.sh makes it: static xxhash, zstd, pcre2, jansson, microhttpd and their headers: the GPU
# machine has no such packages; gpu-deps/mpi/, when there, is an Open MPI bundle the build then
# uses) and the oracle under $GLM5_SHARED. CC defaults to /opt/gcc/bin/gcc
# when present. Warnings do not fail this build (another compiler than CI's may warn differently;
# they are listed at the top of the log).
set -u
OUT=${OUT:-/tmp/g5out}
mkdir -p "$OUT"
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # GLM5_SHARED, CC, B, GGUF, P1, GREEDY

{
echo "== device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
nvcc --version | tail -1
$CC --version | head -1
echo "commit ${COMMIT:-?}"

echo "== build"
rm -f $B/gpu/obj/tests/gpu/test_gpu_model.*  # an older build compiled it from test_gpu_model.c.wip
SECONDS=0
# With the Open MPI bundle (scripts/gpu-mpi.sh) the programs get MPI (tests/gpu/mpi_device.sh
# runs them under mpirun); comm.o is rebuilt because it does not track that choice.
mpi_home=""; [ -f gpu-deps/mpi/env.sh ] && mpi_home=$PWD/gpu-deps/mpi
rm -f $B/obj/runtime/cpu/comm.o
echo "MPI bundle: ${mpi_home:-none}"
make -k -j"$(nproc)" CC="$CC" BUILD=$B ${mpi_home:+G5_MPI_HOME=$mpi_home} \
  EXTRA_CFLAGS="-isystem gpu-deps/include -Wno-error" EXTRA_LDFLAGS="-Lgpu-deps/lib" \
  gpu gpu-model $B/bin/glm5-shard >"$OUT/build.log" 2>&1
rc_build=$?
echo "build rc=$rc_build in ${SECONDS}s"
grep -E "warning|error" "$OUT/build.log" | grep -v "Werror\|Wno-error" | head -20

echo "== make test-gpu (every GPU test program, then tests/gpu/oracle_cli.sh)"
SECONDS=0
make CC="$CC" BUILD=$B ${mpi_home:+G5_MPI_HOME=$mpi_home} \
  EXTRA_CFLAGS="-isystem gpu-deps/include -Wno-error" EXTRA_LDFLAGS="-Lgpu-deps/lib" \
  test-gpu >"$OUT/test-gpu.log" 2>&1
rc_test=$?
cp -r $B/gpu/oracle_cli $B/gpu/test-gpu-detail.log "$OUT/" 2>/dev/null
cat "$OUT/test-gpu.log"
echo "test-gpu rc=$rc_test in ${SECONDS}s"
if [ "${CONVERT_BENCH:-1}" = 1 ]; then
  echo "== converter benchmark (bench/convert.sh on the device's disk, EXPERTS=${EXPERTS:-160})"
  rm -rf /tmp/g5bench
  BIN=$B/bin/glm5-shard WORK=/tmp/g5bench TP=8 timeout "${BENCH_LIMIT:-240}" bash bench/convert.sh 2>&1 | tee "$OUT/convert_bench.log"
  echo "bench rc=${PIPESTATUS[0]}"
  df -h /tmp | tail -1; nproc
  rm -rf /tmp/g5bench
fi
[ "$rc_build" -eq 0 ] && [ "$rc_test" -eq 0 ]
} 2>&1 | tee "$OUT/log"
exit "${PIPESTATUS[0]}"
