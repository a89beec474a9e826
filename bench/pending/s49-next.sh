#!/usr/bin/env bash
# Device calls of session 49 (bench/NOTES.md, session 49), reusable for the next A/B of a decode
# change. Here first: bash bench/ab.sh prepare base=HEAD [NAME=DIR ..]; then, carrying gpu-deps,
# oracle-carry and .dev/ab:
#   bash bench/pending/s49-next.sh test   # ab.sh with TESTGPU=1 (make test-gpu on the working tree,
#                                         # the variants built beside it), one round of bench_peer
#                                         # (tg16 at 512) and of bench_decode (one TP 8 rank, ctx
#                                         # 1024) over the trees
#   bash bench/pending/s49-next.sh rounds # the machine warm: bench_decode and the peer model's tg16
# Prebuilt binaries (the former `bins` mode): bench/pending/s52-next.sh.
set -u
cd "$(dirname "$0")/../.." || exit 2
DEC="--decode --layers 78 --steps 20 --modes fast --graph on"
case "${1:-}" in
test)
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  TESTGPU=1 DECODE=1 ROUNDS=1 PROUNDS=1 DEC="$DEC --ctx 1024" PEER="--pp 512 --depth 512 --tg 16 --batch 1 --reps 2" OUT=$OUT \
    timeout 570 bash bench/ab.sh run >/tmp/ab.log 2>&1
  echo "ab.sh rc=$?"
  grep -E "make test-gpu|passed|round|rc=" /tmp/ab.log | grep -v " 0 failed" | tail -16
  grep -E "make test-gpu" /tmp/ab.log
  ;;
rounds)
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  DECODE=1 ROUNDS=2 PROUNDS=2 DEC="$DEC --ctx 1024" PEER="--pp 512 --depth 512 --tg 16 --batch 1 --reps 2" OUT=$OUT \
    timeout 570 bash bench/ab.sh run >/tmp/ab2.log 2>&1
  echo "ab.sh rc=$?"
  grep -E "round|rc=" /tmp/ab2.log | tail -20
  ;;
*) echo "usage: $0 test|rounds" >&2; exit 2 ;;
esac
