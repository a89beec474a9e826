#!/usr/bin/env bash
# Session 38's device calls for session 36's changes (bench/RESULTS.md, "Session 37"): six of
# the seven ran on the peer model in session 37 (router-route lost and is gone), but 547ff23 (the
# tree without them) did not run in the same call, and the TP 8 rank's decode rounds did not run.
# bench/pending/s37-decode.patch is the six together: s36-aux, s36-absorb-early, s36-g1,
# s36-absorb-one, s36-pdl-trig and s36-pdl-gemv (their separate patches are in git history,
# 149ac36). s37-uv-pdl.patch (after it): the W_UV product (k_head_gemv) becomes a programmatic
# dependent launch that loads its weights (all of them in registers, as it did) before pdl_wait,
# and decode's attention (k_mla_dec) triggers its dependents at its start: a TP 8 rank's 4 MB of
# W_UV load while the attention runs (bench_pdl's form, 4.1 -> 1.9 us a 2 MB kernel).
# s37-uv-q8.patch (after both): the W_UV launch also writes attn_output's two int8 planes of its
# output (cuk_head_gemv's q: a block of 8 warps is one 32-element int8 block, quantized in shared
# memory with q8_quant.cuh's rule), so the quantization launch before attn_output goes: one
# launch less on the main chain a layer; test_kernels' test_head_gemv_q8 checks the bytes against
# cuk_q8_quantize of the same output.
# s37-gu-q8.patch (after the three): the routed experts' gate+up launch (k_gate_up_q8) also
# writes the down product's one-plane int8 input (a cluster of 4 CTAs, 32 rows, is one int8
# block: the first CTA reads the others' rows through distributed shared memory; G = 4 CTAs hold
# a block alone), into a buffer of its own (rk->gq8), so the quantization launch before the down
# goes and the down no longer waits for the shared expert's gate and up; test_gemv_q8 checks the
# bytes against cuk_q8_quantize of the same rows.
# Variants: head = HEAD's files (the tree without any), nog1 = the tree without s36-g1 (it
# reverse-applies to gemv_q8_kern.cuh alone), noq8 = the tree without s37-uv-q8, nouv = the tree
# without s37-uv-q8 and s37-uv-pdl, nogu = the tree without s37-gu-q8.
#   bash bench/pending/s37-first-call.sh here   # applies the four patches, prepares the variants
#   device call 1: bash bench/pending/s37-first-call.sh test  # make test-gpu on the tree, the
#                                   # variants built meanwhile (all kept under build/ for call 2)
#   device call 2 (warm): bash bench/pending/s37-first-call.sh ab   # the peer rounds
#   device call 3 (warm): bash bench/pending/s37-first-call.sh dec  # the TP 8 decode rounds
#   device call 4 (warm, after landing): bash bench/pending/s37-first-call.sh readme  # peer.sh, serve.sh
# carry gpu-deps, oracle-carry and .dev. Land what beats head in both the peer and the TP 8 rounds;
# nog1 decides g1, noq8 and nouv the W_UV launch's two changes, nogu the gate+up's int8 rows.
# Builds are for sm_90 alone now (bench/common.sh), about half of session 37's 222 s; the variants
# build side by side and stay under build/ for the later calls.
# Where make test-gpu fails: test_kernels' head_gemv q8 lines -> s37-uv-q8; test_gemv_q8's "gate_up
# + int8" lines -> s37-gu-q8; test_gpu_model (graph = plain launches, TP 1 = TP n, the bars) ->
# the launches' order: s37-uv-pdl and s37-gu-q8 (programmatic launches, the cluster), then
# s37-decode's aux / absorb-early; the variants' trees (build/ab/NAME) can run the same test.
set -u
cd "$(dirname "$0")/../.." || exit 2
case "${1:-}" in
here)
  for p in decode uv-pdl uv-q8 gu-q8; do
    git apply "bench/pending/s37-$p.patch" || { echo "s37-$p.patch does not apply" >&2; exit 2; }
  done
  # variant $1: copies of the files that patches $2.. touch, with those patches reverse-applied
  # (last first), i.e. the tree without them
  rev() {
    local v=$1 p f
    shift
    rm -rf "/tmp/v-$v" || return 1
    for p in "$@"; do
      git apply --numstat "$p" | cut -f3 | while read -r f; do
        [ -f "/tmp/v-$v/$f" ] && continue
        mkdir -p "/tmp/v-$v/$(dirname "$f")" && cp "$f" "/tmp/v-$v/$f"
      done
    done
    for p in $(printf '%s\n' "$@" | tac); do
      git apply -R --unsafe-paths --directory="/tmp/v-$v" "$p" || return 1
    done
  }
  P=bench/pending
  git show 149ac36:bench/pending/s36-g1.patch >/tmp/s36-g1.patch || exit 2
  rev nog1 /tmp/s36-g1.patch || exit 2
  rev noq8 $P/s37-uv-q8.patch || exit 2
  rev nouv $P/s37-uv-pdl.patch $P/s37-uv-q8.patch || exit 2
  rev nogu $P/s37-gu-q8.patch || exit 2
  bash bench/ab.sh prepare head=HEAD nog1=/tmp/v-nog1 noq8=/tmp/v-noq8 nouv=/tmp/v-nouv nogu=/tmp/v-nogu || exit 2
  ;;
test)
  TESTGPU=1 DECODE=1 ROUNDS=0 bash bench/ab.sh run >"$OUT/ab.log" 2>&1
  grep -E "make test-gpu|passed|variant|build rc|side builds|peer model" "$OUT/ab.log" | grep -v " 0 failed$" | head -20
  ;;
ab) # the peer rounds (six trees, about 210 s)
  ROUNDS=2 LIMIT=90 PEER="--pp 512 --depth 512,4096 --tg 16 --batch 1,8,32 --reps 1" \
    bash bench/ab.sh run >"$OUT/ab.log" 2>&1
  grep -E "^round|rc=|side builds" "$OUT/ab.log"
  python3 bench/ab_table.py "$OUT/ab.log"
  ;;
dec) # the TP 8 rank's decode rounds (six trees, about 300 s)
  DECODE=1 ROUNDS=2 PROUNDS=0 LIMIT=90 bash bench/ab.sh run >"$OUT/ab.log" 2>&1
  grep -E "^decode round|rc=|side builds" "$OUT/ab.log"
  python3 bench/ab_table.py "$OUT/ab.log"
  ;;
readme) # call 4, on the tree as landed: the README's rows (the peer model of calls 1-2 reused)
  W=$PWD/build/g5peer CENTRED=1 LONG=0 PRECISIONS=fast bash bench/peer.sh >"$OUT/peer.out" 2>&1
  echo "peer.sh rc=$?"
  W=$PWD/build/g5peer SKIP_BUILD=0 CENTRED=1 PRECISIONS=fast VERIFY=1 bash bench/serve.sh >"$OUT/serve.out" 2>&1
  echo "serve.sh rc=$?"
  tail -25 "$OUT/peer.out"; tail -12 "$OUT/serve.out"
  ;;
*) echo "usage: $0 here|test|ab|dec|readme" >&2; exit 2 ;;
esac
