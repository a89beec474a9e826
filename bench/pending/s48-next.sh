#!/usr/bin/env bash
# Device calls of session 48 (bench/NOTES.md, session 48), reusable for the next A/B of a decode
# change. Here first: bash bench/ab.sh prepare base=HEAD [NAME=DIR ..]; then, carrying gpu-deps,
# oracle-carry and .dev/ab:
#   bash bench/pending/s48-next.sh test   # ab.sh with TESTGPU=1 (make test-gpu on the working tree,
#                                         # the variants built beside it), one round of bench_peer
#                                         # (tg16 at 512) and of bench_decode (one TP 8 rank, ctx
#                                         # 1024) over the trees
#   bash bench/pending/s48-next.sh rounds # the machine warm: bench_decode and the peer model's tg16
# or, with binaries built here (bench_decode of each tree, stripped, xz'd as .dev/bins/dec_NAME.xz:
# a device call of about 70 s instead of a build of about 350 s):
#   bash bench/pending/s48-next.sh bins   # carry .dev/bins alone: two rounds over them alternated
set -u
cd "$(dirname "$0")/../.." || exit 2
DEC="--decode --layers 78 --ctx 1024 --steps 20 --modes fast --graph on"
case "${1:-}" in
test)
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  TESTGPU=1 DECODE=1 ROUNDS=1 PROUNDS=1 DEC="$DEC" PEER="--pp 512 --depth 512 --tg 16 --batch 1 --reps 2" OUT=$OUT \
    timeout 570 bash bench/ab.sh run >/tmp/ab.log 2>&1
  echo "ab.sh rc=$?"
  grep -E "make test-gpu|passed|round|rc=" /tmp/ab.log | grep -v " 0 failed" | tail -16
  grep -E "make test-gpu" /tmp/ab.log
  ;;
rounds)
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  DECODE=1 ROUNDS=2 PROUNDS=2 DEC="$DEC" PEER="--pp 512 --depth 512 --tg 16 --batch 1 --reps 2" OUT=$OUT \
    timeout 570 bash bench/ab.sh run >/tmp/ab2.log 2>&1
  echo "ab.sh rc=$?"
  grep -E "round|rc=" /tmp/ab2.log | tail -20
  ;;
bins)
  # carry .dev/bins alone: bench_decode binaries built here (dec_NAME.xz, sm_90, static but for
  # cuBLAS), two rounds over them alternated; test binaries (t_NAME.xz) first, once each
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  (cd .dev/bins && for f in *.xz; do xz -dc "$f" >"/tmp/${f%.xz}" && chmod +x "/tmp/${f%.xz}"; done)
  for f in .dev/bins/t_*.xz; do # test binaries (t_NAME.xz), once each: their last line
    [ -f "$f" ] || continue
    v=$(basename "${f%.xz}")
    timeout 120 "/tmp/$v" >"$OUT/$v.log" 2>&1
    echo "$v rc=$?: $(tail -1 "$OUT/$v.log")"
    grep -E "^FAIL" "$OUT/$v.log" | head -5
  done
  for r in 1 2; do
    for f in .dev/bins/dec_*.xz; do
      v=$(basename "${f%.xz}")
      timeout 120 "/tmp/$v" $DEC >"/tmp/$v.$r.log" 2>&1
      echo "round $r $v rc=$?: $(grep -E '^decode ' "/tmp/$v.$r.log" | sed 's/ median of.*RATIO/, ratio/; s/ (vs.*//' | tr -s ' ')"
    done
  done
  for f in .dev/bins/dec_*.xz; do v=$(basename "${f%.xz}"); cp "/tmp/$v.2.log" "$OUT/$v.log"; done
  ;;
*) echo "usage: $0 test|rounds|bins" >&2; exit 2 ;;
esac
