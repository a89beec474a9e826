#!/usr/bin/env bash
# Session 36's first device calls, prepared in session 35 (bench/NOTES.md, "Session 35").
# s35-span.patch: k_gemv_q8 and k_down_q8 put rows of <= 16 units (64-element units) side by
# side in a warp (span lanes a row, 32 / span rows) instead of leaving 32 - units lanes idle; the
# same sums in the same tree (a span's tree, then + 0: what the idle lanes added), so the bits
# are unchanged. It matters at TP 8's shapes: the expert down reads rows of k = 256 (4 units: 28
# of 32 lanes idle), attn_output k = 1024 (16 units), the shared expert's down k = 256; the peer
# model (TP 1) has no row under 32 units.
#   bash bench/pending/s35-first-call.sh here     # here: applies the patch, keeps HEAD's header
#   bash bench/pending/s35-first-call.sh test     # device call 1: build, make test-gpu, bench_decode
#   bash bench/pending/s35-first-call.sh ab       # device call 2 (warm): HEAD's header in a copy,
#                                                 # bench_decode both, two rounds alternated
# carry gpu-deps, oracle-carry and .dev. A cold build took 175-180 s in most calls of sessions
# 34-35 but 443 s in one, so the test run and the A/B are two calls.
set -u
cd "$(dirname "$0")/../.."
case "${1:-}" in
here)
  mkdir -p .dev/base/cuda
  git show HEAD:cuda/gemv_q8_kern.cuh >.dev/base/cuda/gemv_q8_kern.cuh
  git apply bench/pending/s35-span.patch
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
  rm -rf /tmp/base && cp -a . /tmp/base && cp .dev/base/cuda/gemv_q8_kern.cuh /tmp/base/cuda/gemv_q8_kern.cuh
  (cd /tmp/base && bench_build "$OUT/build_base.log" "$B/gpu/tests/bench_decode") || exit 3
  for r in 1 2; do
    for t in /tmp/base "$PWD"; do
      n=$([ "$t" = /tmp/base ] && echo base || echo span)
      (cd "$t" && timeout 90 "$B/gpu/tests/bench_decode" --decode --layers 78 --ctx 1024,32768 --steps 20 \
        --modes fast --graph on) >"$OUT/dec_${n}_$r.log" 2>&1
      echo "round $r $n: $(grep -E '^decode fast' "$OUT/dec_${n}_$r.log" | sed 's/|.*RATIO/ RATIO/; s/(vs.*//' | tr '\n' ';')"
    done
  done
  grep -E "moe_down|attn_output|shared silu|per layer|totals" "$OUT/dec_base_2.log" "$OUT/dec_span_2.log"
  echo "total ${SECONDS}s"
  ;;
*) echo "usage: $0 here|test|ab" >&2; exit 2 ;;
esac
