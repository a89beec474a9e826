#!/usr/bin/env bash
# Session 34's first device call, prepared on the CPU in session 33 (bench/NOTES.md, "Session 33").
# Here (no GPU needed): builds the two standalone programs into .dev/idx (idxbench with
# s33-topk-one applied to a copy of cuda/, decbench on the tree's cuda/), applies
# s33-absorb-aux.patch and s33-skip-scores.patch to the working tree and prepares the ab.sh
# variants `noabs` (HEAD's runtime/gpu/gpu_attn.c: the absorption on the side stream after
# idx_prep, as landed) and `abs` (the absorption on the third stream, scores always computed).
# Then, on the device (carry gpu-deps, oracle-carry, .dev):
#   ./.dev/idx/idxbench 200 >$OUT/idxbench.log; ./.dev/idx/decbench 200 >$OUT/decbench.log;
#   TESTGPU=1 ROUNDS=2 PEER="--pp 512 --depth 512 --tg 16 --batch 1,32 --reps 1" bash bench/ab.sh run
# make test-gpu there runs on the working tree: 952efcd's staged scores (not yet run in the
# runtime), the absorption on the third stream and no scores while every key is selected.
set -euo pipefail
cd "$(dirname "$0")/../.."
P=bench/pending
NV="nvcc -std=c++17 -O3 -arch=sm_90 -Xcompiler -Wall,-Wextra,-Wno-unknown-pragmas,-ffp-contract=off -Werror all-warnings"
rm -rf /tmp/tk && mkdir -p /tmp/tk .dev/idx && cp -r cuda /tmp/tk/
patch -s -p1 -d /tmp/tk <"$P/s33-topk-one.patch"
gcc -std=c11 -D_GNU_SOURCE -O2 -I. -c format/status.c -o /tmp/tk/status.o
$NV -I. -c cuda/device.cu -o /tmp/tk/device.o
# quoted includes of cuda/... resolve in /tmp/tk first: the patched indexer.cu
$NV -I/tmp/tk -I. -cudart static -o .dev/idx/idxbench "$P/idxbench.cu" /tmp/tk/device.o /tmp/tk/status.o
$NV -I. -cudart static -o .dev/idx/decbench "$P/decbench.cu" /tmp/tk/device.o /tmp/tk/status.o
rm -rf /tmp/v-noabs /tmp/v-abs && mkdir -p /tmp/v-noabs/runtime/gpu /tmp/v-abs/runtime/gpu
git show HEAD:runtime/gpu/gpu_attn.c >/tmp/v-noabs/runtime/gpu/gpu_attn.c
git apply "$P/s33-absorb-aux.patch"
cp runtime/gpu/gpu_attn.c /tmp/v-abs/runtime/gpu/gpu_attn.c
git apply "$P/s33-skip-scores.patch"
bash bench/ab.sh prepare noabs=/tmp/v-noabs abs=/tmp/v-abs
