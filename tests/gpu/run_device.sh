#!/usr/bin/env bash
# One call on the GPU machine: build the GPU tree, run every GPU test, then glm5-run --device cuda
# on the oracle (with --check), then the converter benchmark (bench/convert.sh, TP=8, on the
# device's disk; CONVERT_BENCH=0 skips it, EXPERTS=64 makes it smaller, BENCH_LIMIT caps it in
# seconds). Everything goes to $OUT (log, build.log, test_gpu_model.log, test_gpu_mtp.log,
# convert_bench.log).
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
W=/tmp/g5work
rm -rf "$W" && mkdir -p "$W"

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
echo "build rc=$? in ${SECONDS}s"
grep -E "warning|error" "$OUT/build.log" | grep -v "Werror\|Wno-error" | head -20

echo "== GPU tests"
SECONDS=0
$B/gpu/tests/test_gpu_model >"$OUT/test_gpu_model.log" 2>&1
echo "test_gpu_model rc=$? in ${SECONDS}s"
grep -E "FAIL|graph|logits rel|greedy|loader|rt_gpu_model_create|check over|top-k:|hidden|mla |route |idx_|dequant|silu|GPU blobs|GPU gguf" "$OUT/test_gpu_model.log" | head -120
tail -1 "$OUT/test_gpu_model.log"
SECONDS=0  # the NextN/MTP block vs rt_model_mtp: every draft-logits line, then the verdict
$B/gpu/tests/test_gpu_mtp >"$OUT/test_gpu_mtp.log" 2>&1
echo "test_gpu_mtp rc=$? in ${SECONDS}s"
grep -E "FAIL|rel L2|skipped|differ|per position|ranks? on" "$OUT/test_gpu_mtp.log" | head -80
tail -1 "$OUT/test_gpu_mtp.log"
others=""
for t in $B/gpu/tests/test_*; do case $t in *test_gpu_model|*test_gpu_mtp) ;; *) others="$others $t";; esac; done
BUILD=$B bash scripts/run_tests.sh $others

echo "== glm5-run --device cuda"
$B/bin/glm5-shard convert --tp 1 --quiet -o $W/tp1 "$GGUF" && \
$B/bin/glm5-shard convert --tp 2 --quiet -o $W/tp2 "$GGUF" && \
$B/bin/glm5-shard convert --tp 1 --kv-b-type bf16 --quiet -o $W/tp1bf16 "$GGUF"
echo "convert rc=$?"
echo "-- TP=1 blobs, prompt 1, 24 greedy tokens, --check 200"
ids=$($B/gpu/bin/glm5-run -m $W/tp1 --device cuda --tokens $P1 -n 24 --temp 0 --ids --check 200 2>"$OUT/check_tp1.txt")
rc=$?
cat "$OUT/check_tp1.txt"
echo "rc=$rc ids: $ids"
[ "$ids" = "$GREEDY" ] && echo "greedy continuation EQUALS the oracle's" || echo "greedy continuation DIFFERS from the oracle's: $GREEDY"
echo "-- TP=1 blobs, prompt 1, 24 greedy tokens, --cuda-graph on (precise, then fast)"
for pr in precise fast; do
  ids=$($B/gpu/bin/glm5-run -m $W/tp1 --device cuda --tokens $P1 -n 24 --temp 0 --ids -q --precision $pr --cuda-graph on)
  echo "rc=$?"
  [ "$ids" = "$GREEDY" ] && echo "$pr --cuda-graph on greedy EQUALS the oracle's" || echo "$pr --cuda-graph on greedy: $ids"
done
echo "-- --draft mtp (MTP drafts verified by two-token calls): TP=1 and TP=2 precise must equal, fast printed"
for cfg in tp1:precise tp2:precise tp1:fast; do
  d=${cfg%:*}; pr=${cfg#*:}
  ids=$($B/gpu/bin/glm5-run -m $W/$d --device cuda --tokens $P1 -n 24 --temp 0 --ids --precision $pr --draft mtp 2>"$OUT/draft_${d}_${pr}.txt")
  echo "rc=$?"; grep -E "draft mtp|glm5-run:.*(error|fail)" "$OUT/draft_${d}_${pr}.txt"
  [ "$ids" = "$GREEDY" ] && echo "$d $pr --draft mtp greedy EQUALS the oracle's" || echo "$d $pr --draft mtp greedy: $ids"
done
echo "-- TP=2 blobs on one GPU (device-side sum), --check 100"
$B/gpu/bin/glm5-run -m $W/tp2 --device cuda --tokens $P1 -n 24 --temp 0 --ids --check 100 2>&1 >/dev/null | tail -8
echo "rc=${PIPESTATUS[0]}"
ids=$($B/gpu/bin/glm5-run -m $W/tp2 --device cuda --tokens $P1 -n 24 --temp 0 --ids -q)
echo "rc=$?"
[ "$ids" = "$GREEDY" ] && echo "TP=2 greedy EQUALS the oracle's" || echo "TP=2 greedy DIFFERS: $ids"
echo "-- TP=1 blobs through a one-rank NCCL communicator (G5_GPU_COLLECTIVE=nccl), --check 100"
ids=$(G5_GPU_COLLECTIVE=nccl $B/gpu/bin/glm5-run -m $W/tp1 --device cuda --tokens $P1 -n 24 --temp 0 --ids --check 100 2>"$OUT/check_nccl.txt")
echo "rc=$?"; grep -E "collective|check" "$OUT/check_nccl.txt" | tail -3
[ "$ids" = "$GREEDY" ] && echo "NCCL one-rank greedy EQUALS the oracle's" || echo "NCCL one-rank greedy DIFFERS: $ids"
echo "-- TP=1 blobs, kv_b stored bf16 (dequantized on the GPU), --check 100"
$B/gpu/bin/glm5-run -m $W/tp1bf16 --device cuda --tokens $P1 -n 4 --temp 0 --ids --check 100 2>&1 | tail -3
echo "rc=${PIPESTATUS[0]}"
echo "-- GGUF source, text prompt, --no-verify has no effect there"
$B/gpu/bin/glm5-run -m "$GGUF" --device cuda -p "The quick brown fox" -n 16 --temp 0
echo "rc=$?"
echo "-- --no-verify on blobs"
$B/gpu/bin/glm5-run -m $W/tp1 --device cuda --tokens $P1 -n 1 --temp 0 --ids --no-verify 2>&1 | tail -2
echo "rc=${PIPESTATUS[0]}"
for kc in bf16 f16 f32; do
  echo "-- --precision fast --kv-cache $kc, 24 greedy tokens, --check 100 (loose tolerances)"
  ids=$($B/gpu/bin/glm5-run -m $W/tp1 --device cuda --tokens $P1 -n 24 --temp 0 --ids --precision fast --kv-cache $kc --check 100 2>"$OUT/check_fast_$kc.txt")
  echo "rc=$?"; grep -E "^glm5-run|logits rel" "$OUT/check_fast_$kc.txt" | tail -4
  [ "$ids" = "$GREEDY" ] && echo "fast/$kc greedy EQUALS the oracle's" || echo "fast/$kc greedy: $ids"
done
if [ "${CONVERT_BENCH:-1}" = 1 ]; then
  echo "== converter benchmark (bench/convert.sh on the device's disk, EXPERTS=${EXPERTS:-160})"
  rm -rf /tmp/g5bench
  BIN=$B/bin/glm5-shard WORK=/tmp/g5bench TP=8 timeout "${BENCH_LIMIT:-240}" bash bench/convert.sh 2>&1 | tee "$OUT/convert_bench.log"
  echo "bench rc=${PIPESTATUS[0]}"
  df -h /tmp | tail -1; nproc
  rm -rf /tmp/g5bench
fi
} 2>&1 | tee "$OUT/log"
