#!/usr/bin/env bash
# Session 52's device call (bench/NOTES.md, session 52), carrying $BINS alone (default .dev/bins9:
# dec_h, dec_g1, dec_g2 = bench_decode of HEAD and of the two grid variants; t_q8 = test_gemv_q8
# of g2's tree; mla = bench_mla_dec of HEAD):
#   bash bench/pending/s52-next.sh     # t_q8; bench_decode rounds at ctx 1024 (two) and 32768
#                                      # (one), the trees alternated; then ncu --set full of one
#                                      # k_mla_dec launch at 8 heads, one sequence, 1024 keys
# CTXS (default "1024 1024 32768") the rounds' contexts; ROW the profile rows shown (an ERE,
# default q_b, attn_output, idx_q_b); QUICK=1 skips the test binaries and ncu. It replaces
# s49-next.sh's `bins` mode.
set -u
cd "$(dirname "$0")/../.." || exit 2
BINS=${BINS:-.dev/bins9}
OUT=${OUT:-/tmp/s52}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(cd "$BINS" && for f in *.xz; do xz -dc "$f" >"/tmp/${f%.xz}" && chmod +x "/tmp/${f%.xz}"; done)
if [ "${QUICK:-0}" != 1 ]; then
  for f in "$BINS"/t_*.xz; do # test binaries (t_q8 here; s51-bins.sh names them t_gemv_q8 ..)
    [ -f "$f" ] || continue
    v=$(basename "${f%.xz}")
    timeout 200 "/tmp/$v" >"$OUT/$v.log" 2>&1
    echo "$v rc=$?: $(tail -1 "$OUT/$v.log")"
    grep -E "^FAIL" "$OUT/$v.log" | head -5
  done
fi
DEC="--decode --layers 78 --steps 20 --modes fast --graph on"
for ctx in ${CTXS:-1024 1024 32768}; do
  for f in "$BINS"/dec_*.xz; do
    v=$(basename "${f%.xz}")
    # shellcheck disable=SC2086 # DEC: several options
    timeout 150 "/tmp/$v" $DEC --ctx "$ctx" >"/tmp/$v.log" 2>&1
    echo "ctx $ctx $v rc=$?"
    grep -E '^decode ' "/tmp/$v.log" | sed 's/ median of.*RATIO/, ratio/; s/ (vs.*//' | tr -s ' '
    grep -E "(${ROW:-q_b gemv|attn_output gemv|idx_q_b[^ ]*})  " "/tmp/$v.log" | tr -s ' '
    if [ "$ctx" = 32768 ]; then cp "/tmp/$v.log" "$OUT/$v.32k.log"; else cp "/tmp/$v.log" "$OUT/$v.log"; fi
  done
done
if [ -f "$BINS/mla.xz" ] && [ "${QUICK:-0}" != 1 ]; then
  NCU=/usr/local/cuda/bin/ncu
  timeout 60 /tmp/mla 8 1 1024 | tail -3
  timeout 200 $NCU -o "$OUT/mla" -f -k regex:k_mla_dec --launch-skip 3 --launch-count 1 --set full /tmp/mla 8 1 1024 \
    >"$OUT/ncu_run.log" 2>&1
  echo "ncu rc=$?"
  timeout 60 $NCU --import "$OUT/mla.ncu-rep" --page details >"$OUT/ncu_details.txt" 2>&1
  timeout 60 $NCU --import "$OUT/mla.ncu-rep" --page source --print-source sass --csv >"$OUT/ncu_sass.csv" 2>&1
  echo "import rc=$? $(wc -l <"$OUT/ncu_details.txt") / $(wc -l <"$OUT/ncu_sass.csv") lines"
  grep -E "Duration|Registers Per|Achieved Occupancy|Block Limit|Elapsed Cycles" "$OUT/ncu_details.txt" | head -12
fi
