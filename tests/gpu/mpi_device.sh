#!/usr/bin/env bash
# One call on the GPU machine: glm5-run --device cuda under mpirun, with the Open MPI bundle
# carried in gpu-deps/mpi/ (scripts/gpu-deps.sh -> scripts/gpu-mpi.sh; the device has no MPI).
# Builds $B (gpu + glm5-shard, with G5_MPI_HOME) unless $B/gpu/bin/glm5-run already links
# libmpi, converts the oracle at TP 1 and TP 2, then compares each run's 24 greedy ids with the
# oracle's: mpirun -np 2 on the CPU (TP 2), -np 1 on the GPU (TP 1, --check), and with two or
# more GPUs -np 2 (TP 2, one process per GPU, NCCL; also with --cuda-graph on) and -np 1
# driving both GPUs. Log in $OUT/log.
#
#   GLM5_SHARED=$PWD/oracle-carry OUT=... bash tests/gpu/mpi_device.sh
set -u
OUT=${OUT:-/tmp/g5out}
mkdir -p "$OUT"
[ -f gpu-deps/mpi/env.sh ] || { echo "no gpu-deps/mpi (run scripts/gpu-deps.sh and carry gpu-deps)"; exit 1; }
. gpu-deps/mpi/env.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # GLM5_SHARED, CC, B, GGUF, P1, GREEDY
# Default binding would pin each process to one core, starving the CPU side of --check.
MPIRUN="mpirun --bind-to none"
W=/tmp/g5mpi
rm -rf "$W" && mkdir -p "$W"

# $1: label; rest: the command. Prints rc and whether the ids equal the oracle's.
greedy() {
  local label=$1; shift
  local ids rc
  ids=$("$@" 2>"$OUT/$label.err")
  rc=$?
  grep -E "rank [0-9]+:|check|collective|error" "$OUT/$label.err" | tail -6
  [ "$ids" = "$GREEDY" ] && echo "$label rc=$rc greedy EQUALS the oracle's" \
                         || echo "$label rc=$rc greedy DIFFERS: $ids"
}

{
echo "== device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
echo "gpus $ngpu, cores $(nproc)"
echo "== mpirun --version"
mpirun --version | head -1
echo "mpirun: $(command -v mpirun)"

echo "== build"
if ! ldd $B/gpu/bin/glm5-run 2>/dev/null | grep -q "libmpi.so.40 => $G5_MPI_HOME"; then
  rm -f $B/obj/runtime/cpu/comm.o  # it does not track the MPI choice
  SECONDS=0
  make -k -j"$(nproc)" CC="$CC" BUILD=$B G5_MPI_HOME="$G5_MPI_HOME" \
    EXTRA_CFLAGS="-isystem gpu-deps/include -Wno-error" EXTRA_LDFLAGS="-Lgpu-deps/lib" \
    gpu $B/bin/glm5-shard $B/bin/glm5-run >"$OUT/mpi_build.log" 2>&1
  echo "build rc=$? in ${SECONDS}s"
  grep -E "error" "$OUT/mpi_build.log" | head -10
fi
ldd $B/gpu/bin/glm5-run | grep -E "libmpi|not found"

echo "== convert"
$B/bin/glm5-shard convert --tp 1 --quiet -o $W/tp1 "$GGUF" && \
$B/bin/glm5-shard convert --tp 2 --quiet -o $W/tp2 "$GGUF"
echo "convert rc=$?"

echo "== mpirun -np 2, CPU, TP 2 (bundle sanity: two processes, shared-memory transport)"
greedy cpu_np2 $MPIRUN -np 2 $B/gpu/bin/glm5-run -m $W/tp2 --device cpu --tokens $P1 -n 24 --temp 0 --ids
echo "== mpirun -np 1, cuda, TP 1, --check 100"
greedy cuda_np1_tp1 $MPIRUN -np 1 $B/gpu/bin/glm5-run -m $W/tp1 --device cuda --tokens $P1 -n 24 --temp 0 --ids --check 100
if [ "$ngpu" -ge 2 ]; then
  echo "== mpirun -np 2, cuda, TP 2 (one process per GPU, NCCL), --check 100"
  greedy cuda_np2_tp2 $MPIRUN -np 2 $B/gpu/bin/glm5-run -m $W/tp2 --device cuda --tokens $P1 -n 24 --temp 0 --ids --check 100
  echo "== mpirun -np 2, cuda, TP 2, precise then fast, no check"
  greedy cuda_np2_tp2_precise $MPIRUN -np 2 $B/gpu/bin/glm5-run -m $W/tp2 --device cuda --tokens $P1 -n 24 --temp 0 --ids -q
  greedy cuda_np2_tp2_fast $MPIRUN -np 2 $B/gpu/bin/glm5-run -m $W/tp2 --device cuda --tokens $P1 -n 24 --temp 0 --ids -q --precision fast
  echo "== mpirun -np 2, cuda, TP 2, precise, --cuda-graph on (each process captures its rank's step, NCCL inside)"
  greedy cuda_np2_tp2_graph timeout 300 $MPIRUN -np 2 $B/gpu/bin/glm5-run -m $W/tp2 --device cuda --tokens $P1 -n 24 --temp 0 --ids -q --cuda-graph on
  echo "== mpirun -np 1, cuda, TP 2 on two GPUs (one process, NCCL)"
  greedy cuda_np1_tp2 $MPIRUN -np 1 $B/gpu/bin/glm5-run -m $W/tp2 --device cuda --tokens $P1 -n 24 --temp 0 --ids -q
else
  echo "== one GPU: the TP 2 runs under mpirun -np 2 need two (skipped)"
fi
} 2>&1 | tee "$OUT/log"
