#!/usr/bin/env bash
# h16bench (bench/pending/h16bench.cu: fp16-mma products for batched decode, bench/RESULTS.md
# session 40) built on the CPU machine and run on the device with no build there.
#   bash bench/pending/s40-next.sh build   # here: the cuda objects it links, then .dev/h16bench
#   device call, carry [".dev"] alone (the binary is ~38 MB): bash bench/pending/s40-next.sh run
# What to read: the one-vector column of k_h16ring (24 warps an SM) against dp4a xs; h16 at 8 and
# 32 vectors against q8t two planes; the bits line (every column equal to its one-vector launch).
set -u
cd "$(dirname "$0")/../.." || exit 2
case "${1:-}" in
build)
  O=build/gpu/obj/cuda
  make -j"$(nproc)" CUDA_ARCH=90 G5_NO_DEPS=1 $O/device.o $O/gemv_q8t.o $O/gemv_q8.o $O/gemv_q8_lba.o \
    $O/gemv_q8_lbb.o $O/gemv_q8_lbc.o $O/moe_plan.o || exit 2
  mkdir -p .dev/fmt
  for f in status quant quant_lowbit; do
    gcc -std=c11 -D_GNU_SOURCE -O2 -ffp-contract=off -I. -c format/$f.c -o .dev/fmt/$f.o || exit 2
  done
  nvcc -std=c++17 -O3 -arch=sm_90 -I. -Xcompiler -Wall,-Wextra,-ffp-contract=off -Werror all-warnings -cudart static \
    -o .dev/h16bench bench/pending/h16bench.cu $O/device.o $O/gemv_q8t.o $O/gemv_q8.o $O/gemv_q8_lba.o \
    $O/gemv_q8_lbb.o $O/gemv_q8_lbc.o $O/moe_plan.o .dev/fmt/*.o || exit 2
  rm -rf .dev/fmt
  ls -la .dev/h16bench
  ;;
run)
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  timeout 300 .dev/h16bench 30
  echo "h16bench rc=$?"
  ;;
*) echo "usage: $0 build|run" >&2; exit 2 ;;
esac
