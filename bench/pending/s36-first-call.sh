#!/usr/bin/env bash
# Session 37's first device calls, prepared in session 36 (bench/NOTES.md, "Session 36"). Six
# changes, each meant to leave every bit as it is:
# s36-aux.patch: the indexer's key and weight projections (idx_k, idx_proj) move from the side
#   stream (after the latent path) to the third stream, ahead of idx_q_b; gm_aux_begin forks the
#   third stream again instead of joining it when it is started a second time. On the TP 8 rank
#   the side chain (kv_a, latent, idx_k, idx_proj: ~35 us a layer marked) was longer than the main
#   chain (q_a, q_a_norm, q_b: ~31.5).
# s36-g1.patch: session 35's g1small (a plain int8 GEMV of 17-32 units takes G = 1 where G = 4's
#   grid leaves SMs without a CTA: the rank's q_b, idx_q_b, attn_output). Neutral in session 36's
#   graph step while q_b was off the critical path; with s36-aux it is on it.
# s36-absorb-one.patch: a one-token absorption (k_absorb_one) with each thread's whole W_UK column
#   in registers, the CPU's order (the split kernel's bits); test_gpu_model's absorb table gains
#   one-token shapes (64 and 8 heads, 2 and 3 chunks). The absorption runs on the side stream
#   beside the indexer's selection and is the longer of the two at 512-1k keys.
# s36-router-route.patch: a one-token decode step's router product and routing in one launch
#   (cuk_router_route: the last CTA of cuk_gemv_wide's grid to finish routes the token, counted
#   on a device word in the work buffer); k_route's body moves to cuda/route.cuh for both; the
#   test is test_rowops' test_router_route (the fused launch against the two, bit for bit).
# s36-pdl-trig.patch + s36-pdl-gemv.patch: session 22's PDL on the int8 GEMVs (ded0813, reverted
#   for no gain on the peer model's long rows) again, for the TP 8 rank's short ones: k_gemv_q8 and
#   k_down_q8 are programmatic launches; a one-vector, one-group instance loads its lanes' first
#   unit of weights before pdl_wait, which with span / g1 is a lane's whole share there (the form
#   bench_pdl found 2 us a kernel faster); k_norm, k_quantize and k_silu_mul_q8 trigger their
#   dependents at their start (cuda/pdl.cuh). Other instances wait first (ptxas: the preload in
#   them spilled). Variant nopdl: the tree's gemv_q8_kern.cuh without s36-pdl-gemv.
# s36-absorb-early.patch (after s36-aux): the absorption starts on the side stream right after
#   q_b instead of after the indexer's preparation launch: it reads q's nope part alone, which the
#   preparation (it ropes the rope part in place) does not touch. At one token it was the longer
#   branch (peer: 18.1 us against the selection's 4.6), so its start moves 7.6-9 us earlier.
#   bash bench/pending/s36-first-call.sh here   # applies the seven, prepares the ab.sh variants,
#                                               # each the tree without one change: noaux, late,
#                                               # nog1, nopdl, noabs, norr (HEAD's gpu_ffn.c: the
#                                               # router and the routing in two launches)
#                                               # and builds .dev/idx/absbench (needs a gpu build's
#                                               # device.o and attn_dec.o: make gpu, or the two)
#   device call 1: bash bench/pending/s36-first-call.sh test  # absbench, build, make test-gpu,
#                                                             # variant builds, the peer model
#   device call 2 (warm): bash bench/pending/s36-first-call.sh ab  # peer and TP 8 decode rounds
# carry gpu-deps, oracle-carry and .dev.
set -u
cd "$(dirname "$0")/../.." || exit 2
case "${1:-}" in
here)
  for p in aux absorb-early g1 absorb-one router-route pdl-trig pdl-gemv; do
    git apply "bench/pending/s36-$p.patch" || { echo "s36-$p.patch does not apply" >&2; exit 2; }
  done
  # variant $1: the tree's file $3 without patch $2's change to it
  rev() {
    rm -rf "/tmp/v-$1" && mkdir -p "/tmp/v-$1/$(dirname "$3")" && cp "$3" "/tmp/v-$1/$3" &&
      git apply -R --include="*/$3" --unsafe-paths --directory="/tmp/v-$1" "bench/pending/s36-$2.patch"
  }
  rev noaux aux runtime/gpu/gpu_attn.c || exit 2 # gm_aux_begin's change is then idle
  rev late absorb-early runtime/gpu/gpu_attn.c || exit 2
  rev nog1 g1 cuda/gemv_q8_kern.cuh || exit 2
  rev nopdl pdl-gemv cuda/gemv_q8_kern.cuh || exit 2
  rev noabs absorb-one cuda/attn.cu || exit 2
  rm -rf /tmp/v-norr && mkdir -p /tmp/v-norr/runtime/gpu
  git show HEAD:runtime/gpu/gpu_ffn.c >/tmp/v-norr/runtime/gpu/gpu_ffn.c # the two launches
  bash bench/ab.sh prepare noaux=/tmp/v-noaux late=/tmp/v-late nog1=/tmp/v-nog1 nopdl=/tmp/v-nopdl \
    noabs=/tmp/v-noabs norr=/tmp/v-norr || exit 2
  gcc -std=c11 -D_GNU_SOURCE -O2 -I. -c format/status.c -o /tmp/status.o || exit 2
  make -j2 CUDA_ARCH=90 G5_NO_DEPS=1 build/gpu/obj/cuda/device.o build/gpu/obj/cuda/attn_dec.o || exit 2
  mkdir -p .dev/idx && nvcc -std=c++17 -O3 -arch=sm_90 -I. -Xcompiler -Wall,-Wextra,-ffp-contract=off \
    -Werror all-warnings -cudart static -o .dev/idx/absbench bench/pending/absbench.cu \
    build/gpu/obj/cuda/device.o build/gpu/obj/cuda/attn_dec.o /tmp/status.o || exit 2
  ;;
test)
  ./.dev/idx/absbench 200 >"$OUT/absbench.log" 2>&1
  echo "absbench rc=$?"
  grep -E "^\| [0-9]|failed" "$OUT/absbench.log"
  TESTGPU=1 ROUNDS=0 bash bench/ab.sh run >"$OUT/ab.log" 2>&1
  grep -E "make test-gpu|passed|variant|side builds|peer model" "$OUT/ab.log" | grep -v " 0 failed$" | head -20
  ;;
ab)
  DECODE=1 ROUNDS=2 LIMIT=90 PEER="--pp 512 --depth 512,4096 --tg 16 --batch 1,8,32 --reps 1" \
    bash bench/ab.sh run >"$OUT/ab.log" 2>&1
  grep -E "^round|^decode round|rc=" "$OUT/ab.log"
  ;;
*) echo "usage: $0 here|test|ab" >&2; exit 2 ;;
esac
