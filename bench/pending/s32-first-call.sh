#!/usr/bin/env bash
# Session 33's first device call, prepared on the CPU in session 32 (bench/NOTES.md, "Session 32").
# Applies the three-stream indexer chain, the L2 prefetch experiment and the one-token plan made by
# the routing launch to the working tree and prepares ab.sh variants that differ from it in
# runtime/gpu files only (seconds to build each):
#   base    HEAD's runtime/gpu (the new prefetch kernel and route's plan compiled but unused)
#   aux1    HEAD + s32-idxq-aux.patch: only idx_q_b on the third stream, beside q_b
#   chain   the working tree without any prefetch (GM_PF_EIGHTHS 0, GM_PF_NEXT 0)
#   nonext  the working tree without the next layer's prefetch (GM_PF_NEXT 0)
#   noplan  the working tree with the plan launched on its own (ffn_stage's `planned` off)
# Then, on the device (carry gpu-deps, oracle-carry, .dev):
#   TESTGPU=1 ROUNDS=2 PEER="--pp 512 --depth 512 --tg 16 --batch 1,32 --reps 1" bash bench/ab.sh run
set -euo pipefail
cd "$(dirname "$0")/../.."
P=bench/pending
git apply "$P/s32-idx-aux-chain.patch"
git apply "$P/s32-l2-prefetch.patch"
git apply "$P/s32-route-plan.patch"
files="gpu_attn.c gpu_ffn.c gpu_int.h gpu_model.c gpu_prod.c"
fresh() { rm -rf "/tmp/v-$1" && mkdir -p "/tmp/v-$1/runtime/gpu"; }
fresh base
for f in $files; do git show "HEAD:runtime/gpu/$f" >"/tmp/v-base/runtime/gpu/$f"; done
# HEAD's routing arguments with the new plan field (NULL: no plan), for -Wmissing-field-initializers
sed -i 's/hp->expert_weights_scale, rk->ids, rk->wts};/hp->expert_weights_scale, rk->ids, rk->wts, NULL};/' /tmp/v-base/runtime/gpu/gpu_ffn.c
grep -q 'rk->ids, rk->wts, NULL};' /tmp/v-base/runtime/gpu/gpu_ffn.c
fresh aux1
cp /tmp/v-base/runtime/gpu/* /tmp/v-aux1/runtime/gpu/
patch -s -p1 -d /tmp/v-aux1 <"$P/s32-idxq-aux.patch"
for v in chain nonext noplan; do fresh "$v"; done
sed 's/^#define GM_PF_EIGHTHS 8$/#define GM_PF_EIGHTHS 0/' runtime/gpu/gpu_attn.c >/tmp/v-chain/runtime/gpu/gpu_attn.c
sed 's/^#define GM_PF_NEXT 1$/#define GM_PF_NEXT 0/' runtime/gpu/gpu_ffn.c >/tmp/v-chain/runtime/gpu/gpu_ffn.c
cp /tmp/v-chain/runtime/gpu/gpu_ffn.c /tmp/v-nonext/runtime/gpu/gpu_ffn.c
sed 's/const int planned = n == 1 /const int planned = 0 \&\& n == 1 /' runtime/gpu/gpu_ffn.c >/tmp/v-noplan/runtime/gpu/gpu_ffn.c
for v in chain nonext noplan; do
  for f in /tmp/v-$v/runtime/gpu/*; do cmp -s "$f" "runtime/gpu/$(basename "$f")" && { echo "s32-first-call: $v: $f unchanged" >&2; exit 1; }; done
done
bash bench/ab.sh prepare base=/tmp/v-base aux1=/tmp/v-aux1 chain=/tmp/v-chain nonext=/tmp/v-nonext noplan=/tmp/v-noplan
