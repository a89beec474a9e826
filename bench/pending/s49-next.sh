#!/usr/bin/env bash
# Device calls of session 49 (bench/NOTES.md, session 49), reusable for the next A/B of a decode
# change. Here first: bash bench/ab.sh prepare base=HEAD [NAME=DIR ..]; then, carrying gpu-deps,
# oracle-carry and .dev/ab:
#   bash bench/pending/s49-next.sh test   # ab.sh with TESTGPU=1 (make test-gpu on the working tree,
#                                         # the variants built beside it), one round of bench_peer
#                                         # (tg16 at 512) and of bench_decode (one TP 8 rank, ctx
#                                         # 1024) over the trees
#   bash bench/pending/s49-next.sh rounds # the machine warm: bench_decode and the peer model's tg16
# Binaries built here (bench_decode of each tree, stripped, xz'd as $BINS/dec_NAME.xz; test
# binaries as t_NAME.xz), carrying $BINS alone (default
# .dev/bins2; at most four 13 MB binaries and the tree fit the 64 MiB carry):
#   bash bench/pending/s49-next.sh bins   # test binaries once; round 1 at ctx 1024 and 32768
#                                         # (CTX1), round 2 at 1024, the trees alternated; ROW:
#                                         # the profile row shown (default mla_attend)
set -u
cd "$(dirname "$0")/../.." || exit 2
BINS=${BINS:-.dev/bins2}
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
bins)
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  [ -d oracle-carry ] && export GLM5_SHARED=$PWD/oracle-carry # for test binaries that read the oracle
  (cd "$BINS" && for f in *.xz; do xz -dc "$f" >"/tmp/${f%.xz}" && chmod +x "/tmp/${f%.xz}"; done)
  for f in "$BINS"/t_*.xz; do
    [ -f "$f" ] || continue
    v=$(basename "${f%.xz}")
    timeout 240 "/tmp/$v" >"$OUT/$v.log" 2>&1
    echo "$v rc=$?: $(tail -1 "$OUT/$v.log")"
    grep -E "^FAIL" "$OUT/$v.log" | head -5
  done
  for r in 1 2; do
    ctx=${CTX1:-1024,32768}
    [ "$r" = 2 ] && ctx=1024
    for f in "$BINS"/dec_*.xz; do
      v=$(basename "${f%.xz}")
      # shellcheck disable=SC2086 # DEC: several options
      timeout 150 "/tmp/$v" $DEC --ctx "$ctx" >"/tmp/$v.$r.log" 2>&1
      echo "round $r $v rc=$?"
      grep -E '^decode ' "/tmp/$v.$r.log" | sed 's/ median of.*RATIO/, ratio/; s/ (vs.*//' | tr -s ' '
      grep -E "${ROW:-mla_attend}  " "/tmp/$v.$r.log" | head -1 | tr -s ' '
    done
  done
  for f in "$BINS"/dec_*.xz; do v=$(basename "${f%.xz}"); cp "/tmp/$v.1.log" "$OUT/$v.log"; done
  ;;
*) echo "usage: $0 test|rounds|bins" >&2; exit 2 ;;
esac
