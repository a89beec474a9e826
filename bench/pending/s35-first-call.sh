#!/usr/bin/env bash
# Session 36's first device calls, prepared in session 35 (bench/NOTES.md, "Session 35").
# s35-span.patch: k_gemv_q8 and k_down_q8 put rows of <= 16 units (64-element units) side by
#   side in a warp (span lanes a row, 32 / span rows) instead of leaving 32 - units lanes idle;
#   the same sums in the same tree (a span's tree, then + 0: what the idle lanes added), so the
#   bits are unchanged. It matters at TP 8's shapes: the expert down reads rows of k = 256 (4
#   units: 28 of 32 lanes idle), attn_output k = 1024 (16 units), the shared expert's down k =
#   256; the peer model (TP 1) has no row under 32 units.
# s35-router-pdl.patch: cuk_gemv_wide (fast decode's router, its weights all in registers) is
#   launched as a programmatic dependent launch and waits (griddepcontrol.wait) only after its
#   weight loads; k_norm (the MoE layer's ffn_norm before it) lets dependents launch at its start.
#   bench_pdl measured this form at 4.1 -> 1.9 us a 2 MB kernel (RESULTS session 22, H100).
# s35-g1small.patch (on top of s35-span; a variant, not applied to the tree): a plain int8 GEMV of
#   17-32 units a row takes G = 1 where G = 4's grid would leave SMs without a CTA (TP 8's q_b:
#   24 CTAs, its idx_q_b 64; the peer's idx_q_b 64 too); only the grid changes.
#   bash bench/pending/s35-first-call.sh here     # here: applies both patches, keeps HEAD's
#                                                 # gemv_q8 header, prepares the ab.sh variant
#                                                 # nopdl (HEAD's gemv_wide.cu and ops.cu)
#   bash bench/pending/s35-first-call.sh test     # device call 1: build, make test-gpu
#   bash bench/pending/s35-first-call.sh ab       # device call 2 (warm): bench_decode with HEAD's
#                                                 # header (base), the tree (span) and the g1
#                                                 # header (g1), then ab.sh's peer rounds against
#                                                 # nopdl (pdl) and g1
# carry gpu-deps, oracle-carry and .dev. A cold build took 175-180 s in most calls of sessions
# 34-35 but 443 s in one, so the test run and the A/B are two calls.
set -u
cd "$(dirname "$0")/../.."
case "${1:-}" in
here)
  mkdir -p .dev/base/cuda
  git show HEAD:cuda/gemv_q8_kern.cuh >.dev/base/cuda/gemv_q8_kern.cuh
  rm -rf /tmp/v-nopdl && mkdir -p /tmp/v-nopdl/cuda
  git show HEAD:cuda/gemv_wide.cu >/tmp/v-nopdl/cuda/gemv_wide.cu
  git show HEAD:cuda/ops.cu >/tmp/v-nopdl/cuda/ops.cu
  git apply bench/pending/s35-span.patch
  git apply bench/pending/s35-router-pdl.patch
  rm -rf /tmp/v-g1 .dev/g1 && mkdir -p /tmp/v-g1/cuda .dev/g1/cuda
  cp cuda/gemv_q8_kern.cuh /tmp/v-g1/cuda/gemv_q8_kern.cuh
  patch -s -d /tmp/v-g1 -p1 <bench/pending/s35-g1small.patch
  cp /tmp/v-g1/cuda/gemv_q8_kern.cuh .dev/g1/cuda/gemv_q8_kern.cuh
  bash bench/ab.sh prepare nopdl=/tmp/v-nopdl g1=/tmp/v-g1
  ;;
test)
  export GLM5_SHARED=$PWD/oracle-carry
  source bench/common.sh
  SECONDS=0
  bench_header
  bench_build "$OUT/build.log" gpu gpu-model "$B/bin/glm5-shard" "$B/gpu/tests/bench_decode" || exit 3
  make CC="$CC" BUILD="$B" EXTRA_CFLAGS="-isystem $DEPS/include -Wno-error" EXTRA_LDFLAGS="-L$DEPS/lib" \
    TEST_JOBS=8 test-gpu >"$OUT/test-gpu.log" 2>&1
  echo "make test-gpu rc=$? in ${SECONDS}s: $(tail -1 "$OUT/test-gpu.log")"
  grep -E "passed" "$OUT/test-gpu.log" | grep -v " 0 failed" | head -20
  grep -E "^FAIL" "$OUT/test-gpu.log" | head -20
  ;;
ab)
  source bench/common.sh
  SECONDS=0
  bench_header
  for v in base g1; do
    rm -rf /tmp/$v && cp -a . /tmp/$v && cp .dev/$v/cuda/gemv_q8_kern.cuh /tmp/$v/cuda/gemv_q8_kern.cuh
    (cd /tmp/$v && bench_build "$OUT/build_$v.log" "$B/gpu/tests/bench_decode") || exit 3
  done
  for r in 1 2; do
    for t in /tmp/base "$PWD" /tmp/g1; do
      n=$([ "$t" = "$PWD" ] && echo span || basename "$t")
      (cd "$t" && timeout 90 "$B/gpu/tests/bench_decode" --decode --layers 78 --ctx 1024,32768 --steps 20 \
        --modes fast --graph on) >"$OUT/dec_${n}_$r.log" 2>&1
      echo "round $r $n: $(grep -E '^decode fast' "$OUT/dec_${n}_$r.log" | sed 's/|.*RATIO/ RATIO/; s/(vs.*//' | tr '\n' ';')"
    done
  done
  grep -E "moe_down|attn_output|shared silu|q_b|per layer|totals" "$OUT/dec_base_2.log" "$OUT/dec_span_2.log" \
    "$OUT/dec_g1_2.log"
  echo "bench_decode done ${SECONDS}s"
  ROUNDS=2 PEER="--pp 512 --depth 512,4096 --tg 16 --batch 1,8,32 --reps 1" bash bench/ab.sh run >"$OUT/ab.log" 2>&1
  grep -E "^round|rc=" "$OUT/ab.log"
  echo "total ${SECONDS}s"
  ;;
*) echo "usage: $0 here|test|ab" >&2; exit 2 ;;
esac
