#!/usr/bin/env bash
# Session 35's first device call, prepared on the CPU in session 34 (bench/NOTES.md, "Session 34").
# Here (no GPU needed): applies three prepared changes to the working tree:
#   s34-absorb-fast.patch  fast mode's decode absorption with W_UK held in registers (absbench:
#                          15.4 -> 11.0 us a launch at one token of 64 heads on the H100);
#   s34-router-wide.patch  fast mode's decode router product with all of its bytes in flight
#                          (cuk_gemv_wide; routerbench, not yet run, times it against k_gemv);
#   s32-gemv-r1.patch      k_gemv_q8 with one row a warp for q_a / kv_a at one vector;
# builds .dev/idx/absbench, routerbench and idxbench (every top-k form against k_topk) on the
# patched tree, and prepares the ab.sh variants noabs, norouter and nor1 (HEAD's call site of
# each change, or HEAD's kernel header for nor1). Then, on the device (carry gpu-deps, oracle-carry, .dev):
#   ./.dev/idx/absbench 200 >$OUT/absbench.log; ./.dev/idx/routerbench 300 >$OUT/routerbench.log;
#   ./.dev/idx/idxbench 100 >$OUT/idxbench.log;
#   TESTGPU=1 ROUNDS=2 \
#     PEER="--pp 512 --depth 512,4096 --tg 16 --batch 1,32 --reps 1" bash bench/ab.sh run
# (about 550 s from a cold machine: four trees, two rounds; a warm machine reuses the builds, so
# `Q8="20 Q8_0 2048 6144 1;20 Q8_0 576 6144 1" ROUNDS=0 bash bench/ab.sh run` right after gives
# nor1's kernel times)
# make test-gpu there runs on the working tree with all three: test_gpu_model's absorption table
# and test_kernels' gemv_wide table check the new orders' bits against their emulations, and the
# oracle's fast bar decides whether the new sums (absorption, router logits) may land.
set -euo pipefail
cd "$(dirname "$0")/../.."
P=bench/pending
NV="nvcc -std=c++17 -O3 -arch=sm_90 -Xcompiler -Wall,-Wextra,-Wno-unknown-pragmas,-ffp-contract=off -Werror all-warnings"
rm -rf /tmp/v-noabs /tmp/v-norouter /tmp/v-nor1 /tmp/abo
mkdir -p /tmp/abo .dev/idx /tmp/v-noabs/runtime/gpu /tmp/v-norouter/runtime/gpu /tmp/v-nor1/cuda
# each variant lays one call site (or one kernel header) of HEAD over the patched tree, so the
# side builds recompile a file or a few: noabs calls the absorption without .fast, norouter the
# router through gm_gemv_k, nor1 has HEAD's k_gemv_q8
git show HEAD:runtime/gpu/gpu_attn.c >/tmp/v-noabs/runtime/gpu/gpu_attn.c
git show HEAD:runtime/gpu/gpu_ffn.c >/tmp/v-norouter/runtime/gpu/gpu_ffn.c
git show HEAD:cuda/gemv_q8_kern.cuh >/tmp/v-nor1/cuda/gemv_q8_kern.cuh
git apply "$P/s34-absorb-fast.patch"
git apply "$P/s34-router-wide.patch"
git apply "$P/s32-gemv-r1.patch"
gcc -std=c11 -D_GNU_SOURCE -O2 -I. -c format/status.c -o /tmp/abo/status.o
$NV -I. -c cuda/device.cu -o /tmp/abo/device.o
$NV -I. -c cuda/attn_dec.cu -o /tmp/abo/attn_dec.o
$NV -I. -cudart static -o .dev/idx/absbench "$P/absbench.cu" /tmp/abo/device.o /tmp/abo/attn_dec.o /tmp/abo/status.o
$NV -I. -cudart static -o .dev/idx/routerbench "$P/routerbench.cu" /tmp/abo/device.o /tmp/abo/status.o
$NV -I. -cudart static -o .dev/idx/idxbench "$P/idxbench.cu" /tmp/abo/device.o /tmp/abo/status.o
bash bench/ab.sh prepare noabs=/tmp/v-noabs norouter=/tmp/v-norouter nor1=/tmp/v-nor1
