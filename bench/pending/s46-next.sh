#!/usr/bin/env bash
# Device work of session 46 (bench/NOTES.md, session 46), one call each:
#   bash bench/ab.sh prepare base=REV                # here first: the tree to compare against
#   bash bench/pending/s46-next.sh mm                # carry gpu-deps, oracle-carry, .dev/ab:
#       ab.sh with TESTGPU=1 (make test-gpu on the working tree, the variant built beside it),
#       bench_peer pp256 / pp512 / pp4096 of both trees alternated, then bench_moe_mm (R 16 / 32 /
#       64, gate+up and down apart) of both trees, two rounds alternated
#   git apply bench/pending/s46-gemv-xf.patch && bash bench/ab.sh prepare base=HEAD   # here, then
#   bash bench/pending/s46-next.sh xf                # carry gpu-deps, oracle-carry, .dev/ab: make
#       test-gpu on the patched tree (test_gemv_q8's new cuk_gemv_q8_xf cases), then bench_decode
#       (one TP 8 rank, ctx 1024: attn_output takes the fused form there) and bench_peer (TP 1:
#       no product takes it, so it must not move) against HEAD, two rounds alternated
set -u
cd "$(dirname "$0")/../.." || exit 2
case "${1:-}" in
mm)
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  TESTGPU=1 PROUNDS=2 PEER="--pp 256,512,4096 --depth 512 --tg 4 --batch 1 --reps 1" OUT=$OUT \
    timeout 480 bash bench/ab.sh run >/tmp/ab.log 2>&1
  echo "ab.sh rc=$?"
  grep -E "make test-gpu|passed|round|rc=" /tmp/ab.log | grep -v " 0 failed" | tail -12
  grep -E "make test-gpu" /tmp/ab.log
  (mkdir -p /tmp/abl && cd /tmp/abl && tar xzf "$OUT/logs.tgz" 2>/dev/null; grep -H "^pp[0-9]" peer_*.log)
  export CENTRED=1
  source bench/common.sh
  DEPS=$(cd "$DEPS" && pwd)
  M=$B/gpu/tests/bench_moe_mm
  bench_build /tmp/bm_main.log "$M" || exit 3
  (cd build/ab/base && bench_build /tmp/bm_base.log "$M") || exit 3
  for rep in 1 2; do
    for t in . build/ab/base; do
      echo "== $t"
      (cd "$t" && timeout 60 "$M" 16,32,64 --fused-only | grep "fused gate")
    done
  done
  ;;
xf)
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  TESTGPU=1 DECODE=1 ROUNDS=2 DEC="--decode --layers 78 --ctx 1024 --steps 20 --modes fast --graph on" OUT=$OUT \
    timeout 570 bash bench/ab.sh run >/tmp/ab.log 2>&1
  echo "ab.sh rc=$?"
  grep -E "make test-gpu|passed|round|rc=" /tmp/ab.log | grep -v " 0 failed" | tail -14
  grep -E "make test-gpu" /tmp/ab.log
  ;;
*) echo "usage: $0 mm|xf" >&2; exit 2 ;;
esac
