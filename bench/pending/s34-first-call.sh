#!/usr/bin/env bash
# Session 35's first device call, prepared on the CPU in session 34 (bench/NOTES.md, "Session 34").
# Here (no GPU needed): applies s34-absorb-fast.patch (fast mode's decode absorption, W_UK held in
# registers: absbench measured 15.4 -> 11.0 us a launch at one token of 64 heads on the H100) and
# s32-gemv-r1.patch (k_gemv_q8 with one row a warp for q_a / kv_a at one vector) to the working
# tree, builds .dev/idx/absbench on the patched tree and .dev/idx/routerbench (the router's
# float32 product: k_gemv against a prototype with the whole matrix in flight; not yet run) and
# .dev/idx/idxbench (every top-k form against k_topk, after the radix_pick refactor), and
# prepares the ab.sh variants `noabs`
# (HEAD's absorption files) and `nor1` (HEAD's gemv_q8_kern.cuh). Then, on the device (carry
# gpu-deps, oracle-carry, .dev):
#   ./.dev/idx/absbench 200 >$OUT/absbench.log; ./.dev/idx/routerbench 300 >$OUT/routerbench.log;
#   ./.dev/idx/idxbench 100 >$OUT/idxbench.log;
#   TESTGPU=1 ROUNDS=2 \
#     PEER="--pp 512 --depth 512,4096 --tg 16 --batch 1,32 --reps 1" \
#     Q8="20 Q8_0 2048 6144 1;20 Q8_0 576 6144 1" bash bench/ab.sh run
# make test-gpu there runs on the working tree with both patches: test_gpu_model's absorption
# table checks the fast form's bits against its emulated order, and the oracle's fast bar decides
# whether the new order of the absorption's sums may land.
set -euo pipefail
cd "$(dirname "$0")/../.."
P=bench/pending
NV="nvcc -std=c++17 -O3 -arch=sm_90 -Xcompiler -Wall,-Wextra,-Wno-unknown-pragmas,-ffp-contract=off -Werror all-warnings"
rm -rf /tmp/v-noabs /tmp/v-nor1 /tmp/abo && mkdir -p /tmp/v-noabs/cuda /tmp/v-noabs/runtime/gpu /tmp/v-noabs/tests/gpu \
  /tmp/v-noabs/specs /tmp/v-nor1/cuda /tmp/abo .dev/idx
for f in cuda/attn.cu cuda/cuk_model.h runtime/gpu/gpu_attn.c tests/gpu/test_gpu_model.c specs/numerics.md; do
  git show "HEAD:$f" >"/tmp/v-noabs/$f"
done
git show HEAD:cuda/gemv_q8_kern.cuh >/tmp/v-nor1/cuda/gemv_q8_kern.cuh
git apply "$P/s34-absorb-fast.patch"
git apply "$P/s32-gemv-r1.patch"
gcc -std=c11 -D_GNU_SOURCE -O2 -I. -c format/status.c -o /tmp/abo/status.o
$NV -I. -c cuda/device.cu -o /tmp/abo/device.o
$NV -I. -c cuda/attn_dec.cu -o /tmp/abo/attn_dec.o
$NV -I. -cudart static -o .dev/idx/absbench "$P/absbench.cu" /tmp/abo/device.o /tmp/abo/attn_dec.o /tmp/abo/status.o
$NV -I. -cudart static -o .dev/idx/routerbench "$P/routerbench.cu" /tmp/abo/device.o /tmp/abo/status.o
$NV -I. -cudart static -o .dev/idx/idxbench "$P/idxbench.cu" /tmp/abo/device.o /tmp/abo/status.o
bash bench/ab.sh prepare noabs=/tmp/v-noabs nor1=/tmp/v-nor1
